//! bench support

//! The deployment files, checked as far as they can be without a cluster or a container
//! runtime: every Kubernetes manifest in docker/k8s/ and both compose files parse, carry the
//! fields their kind requires, refer only to things that exist (selectors to pod labels,
//! probes and Services to named ports, volumes to ConfigMaps, the SRV name to a headless
//! Service's port), and every memroute config they hold passes `memroute --check`.
use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::time::Duration;

use memroute_tests::*;
use serde_yaml::Value;

fn docker_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("repository")
        .join("docker")
}

/// The value at a dotted path (`spec.template.metadata.labels`), if every step exists.
fn at<'a>(value: &'a Value, path: &str) -> Option<&'a Value> {
    path.split('.').try_fold(value, |v, key| v.get(key))
}

/// The string at `path`, or a failure naming the document and the path.
fn text<'a>(doc: &'a Value, path: &str, what: &str) -> &'a str {
    at(doc, path)
        .and_then(Value::as_str)
        .unwrap_or_else(|| panic!("{what}: `{path}` is required (a string)"))
}

fn labels(value: Option<&Value>) -> BTreeMap<String, String> {
    value
        .and_then(Value::as_mapping)
        .map(|m| {
            m.iter()
                .filter_map(|(k, v)| Some((k.as_str()?.to_string(), v.as_str()?.to_string())))
                .collect()
        })
        .unwrap_or_default()
}

/// `selector` matches `pod` when every selector label is on the pod.
fn selects(selector: &BTreeMap<String, String>, pod: &BTreeMap<String, String>) -> bool {
    !selector.is_empty() && selector.iter().all(|(k, v)| pod.get(k) == Some(v))
}

fn seq(value: Option<&Value>) -> &[Value] {
    value
        .and_then(Value::as_sequence)
        .map(Vec::as_slice)
        .unwrap_or_default()
}

/// Every document of every manifest file, with its file name.
fn manifests() -> Vec<(String, Value)> {
    let dir = docker_dir().join("k8s");
    let mut files: Vec<PathBuf> = std::fs::read_dir(&dir)
        .expect("docker/k8s")
        .map(|e| e.expect("entry").path())
        .filter(|p| p.extension().is_some_and(|e| e == "yaml"))
        .filter(|p| !p.ends_with("kustomization.yaml"))
        .collect();
    files.sort();
    assert!(files.len() >= 4, "manifests missing: {files:?}");
    let mut docs = Vec::new();
    for file in files {
        let name = file
            .file_name()
            .expect("name")
            .to_string_lossy()
            .to_string();
        let text = std::fs::read_to_string(&file).expect("read manifest");
        // Documents are separated by `---` lines (none of these files has one inside a
        // block scalar).
        let documents = text.split("\n---\n");
        for (i, doc) in documents.enumerate() {
            let value: Value = serde_yaml::from_str(doc)
                .unwrap_or_else(|e| panic!("{name} document {i} does not parse: {e}"));
            if !value.is_null() {
                docs.push((format!("{name}#{i}"), value));
            }
        }
    }
    docs
}

/// What a workload (Deployment or StatefulSet) offers to Services and PDBs.
struct Workload {
    what: String,
    pod_labels: BTreeMap<String, String>,
    /// Named container ports: name -> port number.
    ports: BTreeMap<String, u64>,
}

/// `memroute --check` on a config text; panics with its output unless valid.
fn check_memroute_config(what: &str, toml: &str) -> String {
    let dir = TempDir::new("manifest-config");
    let path = dir.write("memroute.toml", toml);
    let out = run_memroute_cli(
        &[
            std::ffi::OsStr::new("--check"),
            std::ffi::OsStr::new("--config"),
            path.as_os_str(),
        ],
        Duration::from_secs(10),
    );
    assert!(
        out.status.success(),
        "{what}: memroute --check rejects the config:\n{}\n{toml}",
        out.stderr
    );
    out.stdout
}

/// Checks one pod template: containers with names and images, probes on named ports the
/// container has, volume mounts of declared volumes, configMap volumes of known ConfigMaps.
/// Returns the named ports.
fn check_pod(what: &str, spec: &Value, config_maps: &BTreeSet<String>) -> BTreeMap<String, u64> {
    let volumes: BTreeMap<String, &Value> = seq(spec.get("volumes"))
        .iter()
        .map(|v| (text(v, "name", what).to_string(), v))
        .collect();
    for (name, volume) in &volumes {
        if let Some(map) = at(volume, "configMap.name").and_then(Value::as_str) {
            assert!(
                config_maps.contains(map),
                "{what}: volume {name} uses ConfigMap {map}, which no manifest defines"
            );
        }
    }
    let containers = seq(spec.get("containers"));
    assert!(!containers.is_empty(), "{what}: no containers");
    let mut all_ports = BTreeMap::new();
    for container in containers {
        let name = text(container, "name", what);
        let what = format!("{what} container {name}");
        text(container, "image", &what);
        let mut ports = BTreeMap::new();
        for port in seq(container.get("ports")) {
            let number = at(port, "containerPort")
                .and_then(Value::as_u64)
                .unwrap_or_else(|| panic!("{what}: a port without containerPort"));
            if let Some(port_name) = port.get("name").and_then(Value::as_str) {
                assert!(
                    port_name.len() <= 15,
                    "{what}: port name {port_name} is longer than 15 characters"
                );
                ports.insert(port_name.to_string(), number);
            }
        }
        for probe in ["readinessProbe", "livenessProbe"] {
            let Some(probe_spec) = container.get(probe) else {
                continue;
            };
            let port = at(probe_spec, "httpGet.port").or_else(|| at(probe_spec, "tcpSocket.port"));
            if let Some(port_name) = port.and_then(Value::as_str) {
                assert!(
                    ports.contains_key(port_name),
                    "{what}: {probe} uses port {port_name}, which the container does not name"
                );
            }
        }
        for mount in seq(container.get("volumeMounts")) {
            let volume = text(mount, "name", &what);
            assert!(
                volumes.contains_key(volume),
                "{what}: mounts volume {volume}, which the pod does not declare"
            );
            text(mount, "mountPath", &what);
        }
        if text(container, "image", &what).contains("memroute") {
            for key in ["resources.requests.cpu", "resources.requests.memory"] {
                assert!(at(container, key).is_some(), "{what}: `{key}` is required");
            }
            assert!(
                container.get("readinessProbe").is_some()
                    && container.get("livenessProbe").is_some(),
                "{what}: memroute needs readiness (/ready) and liveness (/healthz) probes"
            );
            assert_eq!(
                at(container, "securityContext.runAsNonRoot").and_then(Value::as_bool),
                Some(true),
                "{what}: memroute runs as non-root"
            );
        }
        all_ports.extend(ports);
    }
    all_ports
}

#[test]
fn every_kubernetes_manifest_is_complete_and_consistent() {
    let docs = manifests();
    let kinds: Vec<(&str, &str)> = docs
        .iter()
        .map(|(what, doc)| {
            text(doc, "apiVersion", what);
            (text(doc, "kind", what), text(doc, "metadata.name", what))
        })
        .collect();
    let config_maps: BTreeSet<String> = kinds
        .iter()
        .filter(|(kind, _)| *kind == "ConfigMap")
        .map(|(_, name)| name.to_string())
        .collect();

    // Workloads first: what Services and PDBs may select.
    let mut workloads: Vec<Workload> = Vec::new();
    for (what, doc) in &docs {
        let kind = text(doc, "kind", what);
        if kind != "Deployment" && kind != "StatefulSet" {
            continue;
        }
        let selector = labels(at(doc, "spec.selector.matchLabels"));
        let pod_labels = labels(at(doc, "spec.template.metadata.labels"));
        assert!(
            selects(&selector, &pod_labels),
            "{what}: spec.selector.matchLabels {selector:?} does not match the pod labels {pod_labels:?}"
        );
        let spec = at(doc, "spec.template.spec").unwrap_or_else(|| panic!("{what}: no pod spec"));
        let ports = check_pod(what, spec, &config_maps);
        workloads.push(Workload {
            what: what.clone(),
            pod_labels,
            ports,
        });
    }

    let mut headless_srv: BTreeSet<String> = BTreeSet::new();
    let mut kinds_seen = BTreeSet::new();
    for (what, doc) in &docs {
        let kind = text(doc, "kind", what);
        kinds_seen.insert(kind.to_string());
        match kind {
            "Service" => {
                let selector = labels(at(doc, "spec.selector"));
                let backing: Vec<&Workload> = workloads
                    .iter()
                    .filter(|w| selects(&selector, &w.pod_labels))
                    .collect();
                assert!(
                    !backing.is_empty(),
                    "{what}: its selector {selector:?} matches no pods"
                );
                let ports = seq(at(doc, "spec.ports"));
                assert!(!ports.is_empty(), "{what}: no ports");
                for port in ports {
                    at(port, "port")
                        .and_then(Value::as_u64)
                        .unwrap_or_else(|| panic!("{what}: a port without `port`"));
                    if let Some(target) = port.get("targetPort").and_then(Value::as_str) {
                        // The admin port changes state for loopback peers and answers the
                        // kubelet's probes: it is scraped per pod, never offered by a Service.
                        assert_ne!(target, "admin", "{what}: a Service exposes the admin port");
                        for w in &backing {
                            assert!(
                                w.ports.contains_key(target),
                                "{what}: targetPort {target} is not a port of {}",
                                w.what
                            );
                        }
                    }
                    if at(doc, "spec.clusterIP").and_then(Value::as_str) == Some("None") {
                        if let Some(name) = port.get("name").and_then(Value::as_str) {
                            let proto = port
                                .get("protocol")
                                .and_then(Value::as_str)
                                .unwrap_or("TCP")
                                .to_ascii_lowercase();
                            headless_srv.insert(format!(
                                "_{name}._{proto}.{}",
                                text(doc, "metadata.name", what)
                            ));
                        }
                    }
                }
            }
            "PodDisruptionBudget" => {
                let selector = labels(at(doc, "spec.selector.matchLabels"));
                assert!(
                    workloads.iter().any(|w| selects(&selector, &w.pod_labels)),
                    "{what}: its selector matches no pods"
                );
                assert!(
                    at(doc, "spec.minAvailable").is_some()
                        || at(doc, "spec.maxUnavailable").is_some(),
                    "{what}: minAvailable or maxUnavailable is required"
                );
            }
            "StatefulSet" => {
                let service = text(doc, "spec.serviceName", what);
                assert!(
                    docs.iter().any(|(_, d)| {
                        d.get("kind").and_then(Value::as_str) == Some("Service")
                            && at(d, "metadata.name").and_then(Value::as_str) == Some(service)
                            && at(d, "spec.clusterIP").and_then(Value::as_str) == Some("None")
                    }),
                    "{what}: serviceName {service} is not a headless Service here"
                );
            }
            _ => {}
        }
    }
    for kind in [
        "ConfigMap",
        "Deployment",
        "Service",
        "PodDisruptionBudget",
        "StatefulSet",
    ] {
        assert!(kinds_seen.contains(kind), "no {kind} among the manifests");
    }

    // Every memroute config in a ConfigMap passes --check, and an SRV pool names a headless
    // Service's port defined here.
    let mut checked = 0;
    for (what, doc) in &docs {
        if text(doc, "kind", what) != "ConfigMap" {
            continue;
        }
        let Some(toml) = doc
            .get("data")
            .and_then(|d| d.get("memroute.toml"))
            .and_then(Value::as_str)
        else {
            continue;
        };
        let described = check_memroute_config(what, toml);
        checked += 1;
        for line in described
            .lines()
            .filter(|l| l.contains("servers from DNS SRV "))
        {
            let name = line
                .split("servers from DNS SRV ")
                .nth(1)
                .and_then(|rest| rest.split_whitespace().next())
                .expect("SRV name");
            assert!(
                headless_srv
                    .iter()
                    .any(|srv| name == srv || name.starts_with(&format!("{srv}."))),
                "{what}: SRV name {name} is none of the headless Services' ports {headless_srv:?}"
            );
        }
    }
    assert!(
        checked >= 2,
        "expected the tier's and the sidecar's configs, found {checked}"
    );

    // kustomization.yaml lists exactly the manifest files but the sidecar examples, which
    // are applied on their own (they bring an example app).
    let kustomization: Value = serde_yaml::from_str(
        &std::fs::read_to_string(docker_dir().join("k8s/kustomization.yaml"))
            .expect("kustomization"),
    )
    .expect("kustomization parses");
    let listed: BTreeSet<String> = seq(kustomization.get("resources"))
        .iter()
        .filter_map(|v| v.as_str().map(str::to_string))
        .collect();
    let files: BTreeSet<String> = docs
        .iter()
        .filter_map(|(what, _)| what.split('#').next().map(str::to_string))
        .filter(|file| file != "sidecar.yaml" && file != "sidecar-zones.yaml")
        .collect();
    assert_eq!(listed, files, "kustomization.yaml resources");
    // Every memroute container pins its pull policy (a `latest` tag is otherwise pulled on
    // every start, and a local-only image fails to pull).
    for (what, doc) in &docs {
        for container in seq(at(doc, "spec.template.spec.containers")) {
            let image = container.get("image").and_then(Value::as_str).unwrap_or("");
            if image.contains("memroute") {
                assert_eq!(
                    container.get("imagePullPolicy").and_then(Value::as_str),
                    Some("IfNotPresent"),
                    "{what}: the memroute container's imagePullPolicy"
                );
            }
        }
    }
}

/// The one zone a pod template's required node affinity pins it to
/// (`topology.kubernetes.io/zone In [zone]`), if it does.
fn pinned_zone(spec: &Value) -> Option<String> {
    let terms = at(
        spec,
        "affinity.nodeAffinity.requiredDuringSchedulingIgnoredDuringExecution.nodeSelectorTerms",
    );
    let mut zones = Vec::new();
    for term in seq(terms) {
        for expression in seq(term.get("matchExpressions")) {
            if expression.get("key").and_then(Value::as_str) == Some("topology.kubernetes.io/zone")
                && expression.get("operator").and_then(Value::as_str) == Some("In")
            {
                zones.extend(
                    seq(expression.get("values"))
                        .iter()
                        .filter_map(Value::as_str),
                );
            }
        }
    }
    match zones.as_slice() {
        [zone] => Some(zone.to_string()),
        _ => None,
    }
}

/// A sidecar told its zone by `MEMROUTE_ZONE` runs in that zone: its pod is pinned there by
/// node affinity, its config (checked with the variable set, as the pod runs it) names the
/// zone as the proxy's and reads a pool there first; and each memcached StatefulSet pinned
/// to a zone backs the pool of that zone (the pool's SRV name is its headless Service).
#[test]
fn zone_aware_sidecars_run_in_the_zone_they_are_told() {
    let docs = manifests();
    let config_of = |name: &str| {
        docs.iter()
            .filter(|(what, doc)| text(doc, "kind", what) == "ConfigMap")
            .find(|(what, doc)| text(doc, "metadata.name", what) == name)
            .and_then(|(_, doc)| at(doc, "data")?.get("memroute.toml")?.as_str())
            .unwrap_or_else(|| panic!("no ConfigMap {name} with a memroute.toml"))
            .to_string()
    };
    // Per memcached StatefulSet pinned to a zone: (its Service, the zone).
    let pinned_services: BTreeMap<String, String> = docs
        .iter()
        .filter(|(what, doc)| text(doc, "kind", what) == "StatefulSet")
        .filter_map(|(what, doc)| {
            let zone = pinned_zone(at(doc, "spec.template.spec")?)?;
            Some((text(doc, "spec.serviceName", what).to_string(), zone))
        })
        .collect();
    let mut sidecars = 0;
    for (what, doc) in &docs {
        if text(doc, "kind", what) != "Deployment" {
            continue;
        }
        let spec = at(doc, "spec.template.spec").expect("pod spec");
        for container in seq(spec.get("containers")) {
            let zone = seq(container.get("env"))
                .iter()
                .find(|e| e.get("name").and_then(Value::as_str) == Some("MEMROUTE_ZONE"))
                .and_then(|e| e.get("value").and_then(Value::as_str));
            let Some(zone) = zone else { continue };
            sidecars += 1;
            assert_eq!(
                pinned_zone(spec).as_deref(),
                Some(zone),
                "{what}: MEMROUTE_ZONE={zone} but the pod is not pinned to that zone"
            );
            let volume = seq(spec.get("volumes"))
                .iter()
                .find_map(|v| at(v, "configMap.name").and_then(Value::as_str))
                .unwrap_or_else(|| panic!("{what}: no ConfigMap volume"));
            let dir = TempDir::new("manifest-zone");
            let path = dir.write("memroute.toml", &config_of(volume));
            let out = run_program_with_env(
                memroute_binary(),
                &["--check".as_ref(), "--config".as_ref(), path.as_os_str()],
                &[("MEMROUTE_ZONE", zone)],
                Duration::from_secs(10),
            );
            assert!(out.status.success(), "{what}: {}", out.stderr);
            let described = out.stdout;
            assert!(
                described.contains(&format!("proxy: zone {zone} (from MEMROUTE_ZONE)")),
                "{what}: {described}"
            );
            assert!(
                described.contains(&format!("(zone {zone}): the proxy's zone: read here first")),
                "{what}: no pool in zone {zone} is read first:\n{described}"
            );
            // `pool NAME: servers from DNS SRV _memcache._tcp.SERVICE ...`, then the pool's
            // lines, `  zone ZONE` among them.
            let mut srv_service: Option<String> = None;
            for line in described.lines() {
                if let Some(rest) = line.split("servers from DNS SRV _memcache._tcp.").nth(1) {
                    srv_service = rest.split_whitespace().next().map(str::to_string);
                } else if let (Some(pool_zone), Some(service)) =
                    (line.strip_prefix("  zone "), srv_service.as_ref())
                {
                    assert_eq!(
                        pinned_services.get(service).map(String::as_str),
                        Some(pool_zone),
                        "{what}: the pool over {service} says zone {pool_zone}"
                    );
                }
            }
        }
    }
    assert!(
        sidecars >= 2,
        "expected a sidecar per zone, found {sidecars}"
    );
}

#[test]
fn compose_files_refer_to_configs_that_pass_check() {
    let dir = docker_dir();
    for file in [
        "compose.sidecar.yml",
        "compose.tier.yml",
        "compose.zones.yml",
    ] {
        let text = std::fs::read_to_string(dir.join(file)).expect("compose file");
        let doc: Value =
            serde_yaml::from_str(&text).unwrap_or_else(|e| panic!("{file} does not parse: {e}"));
        let services = doc
            .get("services")
            .and_then(Value::as_mapping)
            .unwrap_or_else(|| panic!("{file}: no services"));
        let mut memroutes = 0;
        for (name, service) in services {
            let name = name.as_str().expect("service name");
            let what = format!("{file} service {name}");
            let image = service
                .get("image")
                .and_then(Value::as_str)
                .unwrap_or_else(|| panic!("{what}: no image"));
            for dependency in seq(service.get("depends_on")) {
                let dependency = dependency.as_str().expect("depends_on entry");
                assert!(
                    services.contains_key(dependency),
                    "{what}: depends on {dependency}, which is not a service"
                );
            }
            for volume in seq(service.get("volumes")) {
                let volume = volume.as_str().expect("volume");
                let Some(source) = volume.split(':').next().filter(|s| s.starts_with("./")) else {
                    continue;
                };
                let host = dir.join(source);
                assert!(
                    host.exists(),
                    "{what}: mounts {source}, which does not exist"
                );
                if image.contains("memroute") {
                    let config = host.join("memroute.toml");
                    let toml = std::fs::read_to_string(&config)
                        .unwrap_or_else(|e| panic!("{what}: {}: {e}", config.display()));
                    check_memroute_config(&what, &toml);
                    memroutes += 1;
                }
            }
        }
        assert!(
            memroutes >= 1,
            "{file}: no memroute service with a mounted config"
        );
        if file == "compose.tier.yml" {
            let count = |prefix: &str| {
                services
                    .keys()
                    .filter(|k| k.as_str().is_some_and(|k| k.starts_with(prefix)))
                    .count()
            };
            assert_eq!(count("memcached-"), 3, "{file}: 3 memcached");
            assert_eq!(count("memroute-"), 2, "{file}: 2 memroute");
        }
    }
}

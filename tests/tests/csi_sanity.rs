//! The upstream CSI conformance suite, csi-test's csi-sanity (v5.6.0, from
//! the Go module proxy: `tests/go`, built by `make go-tools`), run as an
//! external user runs it against the stack the demo runs: the controller on
//! moto and `serve.py`, the attach simulator, the helper (root) and the
//! agent (uid 65534), its Node, Controller and GroupController specs over
//! the two CSI sockets. The helper takes csi-sanity's own paths
//! (`--allowed-layout csi-sanity`, a test setting: the suite cannot make
//! kubelet's or Nomad's, which the hostile tests prove). Its world is one
//! node, and it publishes to that node volumes it made with no topology
//! requirement (NodeExpandVolume's specs), which EC2 attaches only in the
//! node's zone (`InvalidVolume.ZoneMismatch`): so the account sees that one
//! zone of the region (serve.py `--zones`, a test setting).
//!
//! Every spec passes or stands in `tests/csi-sanity/excused.tsv` with the
//! reason the suite or moto gives; an excused spec that passes, or that the
//! suite no longer has, fails the run, so the list only shrinks. Specs the
//! suite skips for a capability the driver does not advertise, and those it
//! disables itself (pending), are counted, not excused. (v5.4.0's first
//! connection could wait its whole minute and fail a spec at random: its
//! `utils.Connect` asked for the connection's state only after the
//! connection could be ready, then waited for a change that never came;
//! v5.6.0 asks first.)
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    reason = "integration tests: a failed step fails the test"
)]

use std::collections::BTreeMap;
use std::path::Path;
use std::process::Command;

use ebs_csi_tests::lifecycle::{self, Report};
use ebs_csi_tests::moto::ZONE;
use ebs_csi_tests::{go_tool, repository, require_root};

/// What ginkgo's JSON report says of each spec (`It`), by its full text
/// (its containers' texts and its own, joined by spaces): its state
/// (`passed`, `failed`, `skipped`, …) and its failure's message.
fn spec_states(report: &Path) -> BTreeMap<String, (String, String)> {
    let suites: serde_json::Value = serde_json::from_slice(&std::fs::read(report).unwrap()).unwrap();
    let mut states = BTreeMap::new();
    for spec in suites
        .as_array()
        .unwrap()
        .iter()
        .flat_map(|s| s["SpecReports"].as_array().unwrap())
    {
        if spec["LeafNodeType"] != "It" {
            continue;
        }
        let mut texts: Vec<&str> = spec["ContainerHierarchyTexts"]
            .as_array()
            .map(|c| c.iter().map(|t| t.as_str().unwrap()).collect())
            .unwrap_or_default();
        texts.push(spec["LeafNodeText"].as_str().unwrap());
        let state = spec["State"].as_str().unwrap().to_owned();
        let message = spec["Failure"]["Message"].as_str().unwrap_or_default().to_owned();
        states.insert(texts.join(" "), (state, message));
    }
    states
}

/// `tests/csi-sanity/excused.tsv`: spec text, a tab, the reason; `#`
/// starts a comment line.
fn excused() -> BTreeMap<String, String> {
    let list = std::fs::read_to_string(repository().join("tests/csi-sanity/excused.tsv")).unwrap();
    list.lines()
        .filter(|l| !l.is_empty() && !l.starts_with('#'))
        .map(|l| {
            let (spec, reason) = l.split_once('\t').expect("spec<TAB>reason");
            (spec.to_owned(), reason.to_owned())
        })
        .collect()
}

#[tokio::test(flavor = "multi_thread")]
#[cfg_attr(not_root, ignore = "needs root: loop devices, mounts, the helper")]
async fn csi_sanity_passes_every_spec_but_the_excused() {
    require_root();
    let mut report = Report::new(false);
    let env = lifecycle::start_with(&mut report, &["--allowed-layout", "csi-sanity"], &["--zones", ZONE])
        .await
        .unwrap_or_else(|f| panic!("step {:?} failed: {}\n{}", f.step, f.error, f.log_tail));
    let root = env.dir().join("kubelet");
    let json = env.dir().join("csi-sanity.json");
    let unix = |socket: &Path| format!("unix://{}", socket.display());
    let output = Command::new(go_tool("csi-sanity"))
        .arg(format!("-csi.endpoint={}", unix(env.node_socket())))
        .arg(format!("-csi.controllerendpoint={}", unix(env.controller_socket())))
        .arg(format!("-csi.mountdir={}", root.join("csi-mount").display()))
        .arg(format!("-csi.stagingdir={}", root.join("csi-staging").display()))
        // EBS sizes are whole GiB: 1 GiB, grown to 2.
        .args(["-csi.testvolumesize=1073741824", "-csi.testvolumeexpandsize=2147483648"])
        .args(["-ginkgo.no-color", "-ginkgo.timeout=15m"])
        .arg(format!("-ginkgo.json-report={}", json.display()))
        .output()
        .unwrap();
    let log = String::from_utf8_lossy(&output.stdout);
    assert!(json.exists(), "csi-sanity wrote no report ({}):\n{log}", output.status);
    let states = spec_states(&json);
    let excused = excused();
    let mut problems = Vec::new();
    let mut counts = BTreeMap::<&str, usize>::new();
    for (spec, (state, message)) in &states {
        *counts.entry(state.as_str()).or_default() += 1;
        match (state.as_str(), excused.contains_key(spec)) {
            ("passed", true) => problems.push(format!("excused but passes (take it off the list): {spec}")),
            // `pending`: the suite's own disabled specs (XIt).
            ("passed" | "skipped" | "pending", _) | ("failed", true) => {}
            (_, _) => problems.push(format!("{state}: {spec}\n    {message}")),
        }
    }
    for spec in excused.keys().filter(|s| !states.contains_key(*s)) {
        problems.push(format!("excused but not in the suite: {spec}"));
    }
    drop(tokio::task::spawn_blocking(move || drop(env)).await);
    eprintln!(
        "csi-sanity: {counts:?} of {} specs, {} excused",
        states.len(),
        excused.len()
    );
    assert!(
        problems.is_empty(),
        "{}\n\ncsi-sanity's output:\n{log}",
        problems.join("\n")
    );
}

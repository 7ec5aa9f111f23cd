//! Where the time of NodeStage + NodePublish goes, read from the agent's
//! and the helper's own log lines: tracing's timestamps (RFC 3339,
//! microseconds, the system clock both processes share), the moments they
//! log (`staging`, `exec`, `exited`, `format`, `mount`, …) and the
//! durations their last line carries (the agent's `latency_ms`, the
//! helper's `elapsed_ms`), from which the moment each received the request
//! follows. The client adds the moments it sent and got each answer.

use std::time::SystemTime;

use aws_sdk_ec2::primitives::{DateTime, DateTimeFormat};

/// The client's moments of one NodeStage + NodePublish.
#[derive(Clone, Copy, Debug)]
pub struct ClientStamps {
    /// NodeStageVolume sent.
    pub stage_sent: SystemTime,
    /// NodeStageVolume answered.
    pub staged: SystemTime,
    /// NodePublishVolume sent.
    pub publish_sent: SystemTime,
    /// NodePublishVolume answered.
    pub published: SystemTime,
}

/// Something logged at a moment: `at` in seconds since the epoch, `what`
/// as `process: message` (`helper: exec blkid`).
#[derive(Clone, Debug, PartialEq)]
struct Moment {
    /// Seconds since the epoch.
    at: f64,
    /// Who and what.
    what: String,
}

/// The RPCs traced, and how each process's log names them.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Rpc {
    Stage,
    Publish,
}

impl Rpc {
    fn csi_name(self) -> &'static str {
        match self {
            Self::Stage => "NodeStageVolume",
            Self::Publish => "NodePublishVolume",
        }
    }

    fn agent_message(self) -> &'static str {
        match self {
            Self::Stage => "staging",
            Self::Publish => "publishing",
        }
    }

    fn helper_span(self) -> &'static str {
        match self {
            Self::Stage => "request=Stage(",
            Self::Publish => "request=Publish(",
        }
    }
}

/// One log line of tracing-subscriber's text format:
/// `TIMESTAMP LEVEL [span{fields}: ]target: message field=value …`.
struct Line<'a> {
    at: f64,
    span: &'a str,
    message: &'a str,
    fields: &'a str,
}

impl<'a> Line<'a> {
    fn parse(line: &'a str) -> Option<Self> {
        let (stamp, rest) = line.split_once(' ')?;
        let at = DateTime::from_str(stamp, DateTimeFormat::DateTime).ok()?.as_secs_f64();
        // The target is the first ` ebs_csi_…: `: the span's fields (Debug
        // strings, paths) hold no ` ebs_csi_`.
        let target_at = rest.find(" ebs_csi_")?;
        let (span, after) = rest.split_at(target_at);
        let (_, text) = after.split_once(": ")?;
        // The message is the words before the first `name=value`.
        let message_len: usize = text
            .split(' ')
            .take_while(|word| !word.contains('='))
            .map(|word| word.len() + 1)
            .sum();
        let (message, fields) = text.split_at(message_len.min(text.len()));
        Some(Self {
            at,
            span,
            message: message.trim_end(),
            fields,
        })
    }

    /// The value of `name=` (quotes kept), up to the next space.
    fn field(&self, name: &str) -> Option<&'a str> {
        let key = format!("{name}=");
        let fields = self.fields;
        let start = fields
            .match_indices(&key)
            .find(|(i, _)| *i == 0 || fields.as_bytes()[i - 1] == b' ')?
            .0
            + key.len();
        fields[start..].split(' ').next()
    }

    fn millis_field(&self, name: &str) -> Option<f64> {
        self.field(name)?.parse().ok()
    }
}

/// The moments of one RPC of `volume_id`, in time order: the agent's
/// receipt, its own lines, the helper's receipt and lines, each one's
/// answer.
fn moments(rpc: Rpc, volume_id: &str, agent_log: &str, helper_log: &str) -> Vec<Moment> {
    let mut moments = Vec::new();
    let (quoted, in_path) = (format!("{volume_id:?}"), format!("/{volume_id}/"));
    // The agent's own line for the RPC, which its receipt precedes.
    let mut own_line = f64::INFINITY;
    for line in agent_log
        .lines()
        .filter(|l| l.contains(volume_id))
        .filter_map(Line::parse)
    {
        if line.message == rpc.agent_message() {
            own_line = own_line.min(line.at);
            moments.push(Moment {
                at: line.at,
                what: format!("agent: {}", line.message),
            });
        } else if line.message == "done" && line.field("rpc") == Some(&format!("{:?}", rpc.csi_name())) {
            // The receipt is the answer's time less the latency: the
            // latency comes from the monotonic clock, the line's time from
            // the wall clock when it was written, some microseconds after
            // the call ended; where the agent's own line came within those
            // microseconds of the receipt, the receipt is put a microsecond
            // (the log's resolution) before it.
            let latency = line.millis_field("latency_ms").unwrap_or(0.0);
            moments.push(Moment {
                at: (line.at - latency / 1e3).min(own_line - 1e-6),
                what: "agent: received".into(),
            });
            moments.push(Moment {
                at: line.at,
                what: "agent: answered".into(),
            });
        }
    }
    let helper_lines = helper_log
        .lines()
        .filter(|l| l.contains(&quoted) || l.contains(&in_path))
        .filter_map(Line::parse)
        .filter(|l| l.span.contains(rpc.helper_span()));
    for line in helper_lines {
        let what = match line.message {
            "exec" => format!("exec {}", tool_name(line.field("tool").unwrap_or(""))),
            "exited" => format!("exited {}", tool_name(line.field("tool").unwrap_or(""))),
            "done" => {
                let elapsed = line.millis_field("elapsed_ms").unwrap_or(0.0);
                moments.push(Moment {
                    at: line.at - elapsed / 1e3,
                    what: "helper: received".into(),
                });
                "answered".into()
            }
            other => other.to_owned(),
        };
        moments.push(Moment {
            at: line.at,
            what: format!("helper: {what}"),
        });
    }
    moments.sort_by(|a, b| a.at.total_cmp(&b.at));
    moments
}

/// `/usr/sbin/blkid` → `blkid`; every `mkfs.*` is `mkfs`, so that the
/// filesystems' steps line up.
fn tool_name(path: &str) -> &str {
    let name = path.rsplit('/').next().unwrap_or(path).trim_matches('"');
    if name.starts_with("mkfs.") { "mkfs" } else { name }
}

fn seconds(t: SystemTime) -> f64 {
    t.duration_since(SystemTime::UNIX_EPOCH)
        .map_or(0.0, |d| d.as_secs_f64())
}

/// The steps of one NodeStage + NodePublish of `volume_id`: each as
/// `from → to` and its milliseconds, in order, from the client sending
/// NodeStageVolume to NodePublishVolume's answer. They add up to the
/// client's whole time.
pub fn steps(client: &ClientStamps, volume_id: &str, agent_log: &str, helper_log: &str) -> Vec<(String, f64)> {
    let mut timeline: Vec<(&str, Moment)> = Vec::new();
    for (rpc, sent, answered) in [
        (Rpc::Stage, client.stage_sent, client.staged),
        (Rpc::Publish, client.publish_sent, client.published),
    ] {
        let name = rpc.csi_name();
        let client = |at, what: &str| Moment {
            at: seconds(at),
            what: format!("client: {what}"),
        };
        timeline.push((name, client(sent, "sent")));
        timeline.extend(
            moments(rpc, volume_id, agent_log, helper_log)
                .into_iter()
                .map(|m| (name, m)),
        );
        timeline.push((name, client(answered, "answered")));
    }
    timeline
        .windows(2)
        .map(|pair| {
            let ((rpc, from), (next_rpc, to)) = (&pair[0], &pair[1]);
            let name = if rpc == next_rpc {
                format!("{rpc}: {} → {}", from.what, to.what)
            } else {
                format!("client: {rpc} answered → {next_rpc} sent")
            };
            (name, (to.at - from.at) * 1e3)
        })
        .collect()
}

/// The median of each step over runs, in the order of the first run
/// (a step missing from a run counts only where it occurs).
pub fn medians(runs: &[Vec<(String, f64)>]) -> Vec<(String, f64)> {
    names_in_order(runs.iter().map(Vec::as_slice))
        .into_iter()
        .map(|name| {
            let samples: Vec<f64> = runs
                .iter()
                .flatten()
                .filter(|(n, _)| n == name)
                .map(|(_, ms)| *ms)
                .collect();
            (name.to_owned(), crate::bench::summarize(&samples).0)
        })
        .collect()
}

/// Every step name of `lists`, once, in the order first seen.
fn names_in_order<'a>(lists: impl Iterator<Item = &'a [(String, f64)]>) -> Vec<&'a str> {
    let mut names: Vec<&str> = Vec::new();
    for (name, _) in lists.flatten() {
        if !names.contains(&name.as_str()) {
            names.push(name);
        }
    }
    names
}

/// Renders the steps of each filesystem (`(fs, medians)`) side by side as
/// a Markdown table, with the sum of the medians last.
pub fn markdown(columns: &[(&str, Vec<(String, f64)>)]) -> String {
    let mut out = String::from("| NodeStage + NodePublish, step (median ms) |");
    for (fs, _) in columns {
        out.push_str(&format!(" {fs} |"));
    }
    out.push_str(&format!("\n|---|{}\n", "---:|".repeat(columns.len())));
    for name in names_in_order(columns.iter().map(|(_, steps)| steps.as_slice())) {
        out.push_str(&format!("| {name} |"));
        for (_, steps) in columns {
            let value = steps.iter().find(|(n, _)| n == name).map(|(_, ms)| *ms);
            out.push_str(&value.map_or(" – |".to_owned(), |ms| format!(" {ms:.2} |")));
        }
        out.push('\n');
    }
    out.push_str("| **sum of the medians** |");
    for (_, steps) in columns {
        out.push_str(&format!(" {:.2} |", steps.iter().map(|(_, ms)| ms).sum::<f64>()));
    }
    out.push('\n');
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    const AGENT: &str = "\
2026-11-24T11:28:51.434350Z  INFO ebs_csi_agent::node: staging volume_id=vol-01 device=/dev/loop0 staging_path=\"/k/staging/vol-01\" fs_type=\"ext4\"
2026-11-24T11:28:51.449345Z  INFO ebs_csi_proto::observed: done rpc=\"NodeStageVolume\" subject=\"vol-01\" latency_ms=15.345
2026-11-24T11:28:51.449836Z  INFO ebs_csi_agent::node: publishing volume_id=vol-01 target_path=\"/k/pods/vol-01/mount\" readonly=false
2026-11-24T11:28:51.450772Z  INFO ebs_csi_proto::observed: done rpc=\"NodePublishVolume\" subject=\"vol-01\" latency_ms=1.000
";
    const HELPER: &str = "\
2026-11-24T11:28:51.434999Z  INFO request{peer_uid=65534 request=Stage(StageRequest { volume_id: VolumeId(\"vol-01\"), staging_path: \"/k/staging/vol-01\" })}: ebs_csi_helper::exec: exec tool=/usr/sbin/blkid args=[\"-p\"] device=\"/dev/loop0\"
2026-11-24T11:28:51.441000Z  INFO request{peer_uid=65534 request=Stage(StageRequest { volume_id: VolumeId(\"vol-01\"), staging_path: \"/k/staging/vol-01\" })}: ebs_csi_helper::exec: exited tool=\"blkid\" status=exit status: 2 elapsed_ms=6.001
2026-11-24T11:28:51.449206Z  INFO request{peer_uid=65534 request=Stage(StageRequest { volume_id: VolumeId(\"vol-01\"), staging_path: \"/k/staging/vol-01\" })}: ebs_csi_helper::server: done reply=Done elapsed_ms=14.500
2026-11-24T11:28:51.450657Z  INFO request{peer_uid=65534 request=Publish(PublishRequest { target_path: \"/k/pods/vol-01/mount\" })}: ebs_csi_helper::mount: bind mount source=/proc/self/fd/10 target=/proc/self/fd/9
2026-11-24T11:28:51.450705Z  INFO request{peer_uid=65534 request=Publish(PublishRequest { target_path: \"/k/pods/vol-01/mount\" })}: ebs_csi_helper::server: done reply=Done elapsed_ms=0.200
";

    fn at(stamp: &str) -> SystemTime {
        let seconds = DateTime::from_str(stamp, DateTimeFormat::DateTime)
            .expect("stamp")
            .as_secs_f64();
        SystemTime::UNIX_EPOCH + std::time::Duration::from_secs_f64(seconds)
    }

    #[test]
    fn reads_messages_fields_and_spans() {
        let line = Line::parse(HELPER.lines().nth(1).expect("line")).expect("parsed");
        assert_eq!(line.message, "exited");
        assert_eq!(line.field("tool"), Some("\"blkid\""));
        assert_eq!(line.millis_field("elapsed_ms"), Some(6.001));
        assert!(line.span.contains("request=Stage("));
        let bind = Line::parse(HELPER.lines().nth(3).expect("line")).expect("parsed");
        assert_eq!(bind.message, "bind mount");
        assert_eq!(bind.field("target"), Some("/proc/self/fd/9"));
    }

    #[test]
    fn steps_run_from_the_client_through_both_processes_and_add_up() {
        let client = ClientStamps {
            stage_sent: at("2026-11-24T11:28:51.433000Z"),
            staged: at("2026-11-24T11:28:51.449500Z"),
            publish_sent: at("2026-11-24T11:28:51.449600Z"),
            published: at("2026-11-24T11:28:51.451000Z"),
        };
        let steps = steps(&client, "vol-01", AGENT, HELPER);
        let names: Vec<&str> = steps.iter().map(|(n, _)| n.as_str()).collect();
        assert_eq!(
            names,
            [
                "NodeStageVolume: client: sent → agent: received",
                "NodeStageVolume: agent: received → agent: staging",
                "NodeStageVolume: agent: staging → helper: received",
                "NodeStageVolume: helper: received → helper: exec blkid",
                "NodeStageVolume: helper: exec blkid → helper: exited blkid",
                "NodeStageVolume: helper: exited blkid → helper: answered",
                "NodeStageVolume: helper: answered → agent: answered",
                "NodeStageVolume: agent: answered → client: answered",
                "client: NodeStageVolume answered → NodePublishVolume sent",
                "NodePublishVolume: client: sent → agent: received",
                "NodePublishVolume: agent: received → agent: publishing",
                "NodePublishVolume: agent: publishing → helper: received",
                "NodePublishVolume: helper: received → helper: bind mount",
                "NodePublishVolume: helper: bind mount → helper: answered",
                "NodePublishVolume: helper: answered → agent: answered",
                "NodePublishVolume: agent: answered → client: answered",
            ]
        );
        let total: f64 = steps.iter().map(|(_, ms)| ms).sum();
        assert!((total - 18.0).abs() < 1e-3, "{total}");
        let (_, blkid) = &steps[4];
        assert!((blkid - 6.001).abs() < 1e-3, "{blkid}");
    }

    /// The answer's time less its latency can land after the agent's own
    /// line when that line came within microseconds of the receipt (the
    /// log's wall-clock time is taken after the call ends): the receipt
    /// still comes first.
    #[test]
    fn the_receipt_precedes_the_agents_own_line() {
        let agent = AGENT.replace("latency_ms=15.345", "latency_ms=14.990");
        let client = ClientStamps {
            stage_sent: at("2026-11-24T11:28:51.433000Z"),
            staged: at("2026-11-24T11:28:51.449500Z"),
            publish_sent: at("2026-11-24T11:28:51.449600Z"),
            published: at("2026-11-24T11:28:51.451000Z"),
        };
        let steps = steps(&client, "vol-01", &agent, HELPER);
        assert_eq!(steps[1].0, "NodeStageVolume: agent: received → agent: staging");
        assert!((steps[1].1 - 0.001).abs() < 1e-3, "{steps:?}");
    }

    #[test]
    fn names_tools_so_that_filesystems_line_up() {
        assert_eq!(tool_name("/usr/sbin/blkid"), "blkid");
        assert_eq!(tool_name("\"mkfs.xfs\""), "mkfs");
        assert_eq!(tool_name("/sbin/mkfs.ext4"), "mkfs");
    }

    #[test]
    fn medians_keep_the_first_runs_order() {
        let runs = vec![
            vec![("a".to_owned(), 1.0), ("b".to_owned(), 5.0)],
            vec![("a".to_owned(), 3.0), ("b".to_owned(), 4.0)],
            vec![("a".to_owned(), 2.0), ("b".to_owned(), 6.0)],
        ];
        assert_eq!(medians(&runs), [("a".to_owned(), 2.0), ("b".to_owned(), 5.0)]);
    }
}

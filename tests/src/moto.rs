//! moto server (PyPI `moto[ec2,server]`, a real EC2 Query API
//! implementation) on 127.0.0.1, one per test, behind `tests/ec2/serve.py`
//! (CopyVolumes, which moto lacks, EC2's timing and eventual consistency,
//! and EC2's own answers to the faults a test arms, and the EBS direct
//! APIs over snapshot contents), and the controller binary pointed at it
//! through the SDK's standard endpoint settings.
#![allow(clippy::expect_used, reason = "test support")]

use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use ebs_csi_proto::modify::modify_client::ModifyClient;
use ebs_csi_proto::v1::controller_client::ControllerClient;
use ebs_csi_proto::v1::group_controller_client::GroupControllerClient;
use ebs_csi_proto::v1::identity_client::IdentityClient;
use ebs_csi_proto::v1::snapshot_metadata_client::SnapshotMetadataClient;
use tonic::transport::Channel;

use crate::{Process, Sandbox, binary, channel, spawn, wait_until};

/// The region the tests' EC2 answers for, and the zone of their instances.
pub const REGION: &str = "us-east-1";
/// See [`REGION`].
pub const ZONE: &str = "us-east-1a";

/// The moto server of a test, killed on drop.
pub struct Moto {
    child: Child,
    /// moto's working directory (its request recorder writes a file there).
    _dir: tempfile::TempDir,
    /// `http://HOST:PORT`.
    pub endpoint: String,
    host: String,
    port: u16,
}

impl Moto {
    /// Starts moto on a free loopback port with serve.py's default timing
    /// and waits until it answers.
    pub fn start() -> Self {
        Self::start_with(&[])
    }

    /// [`Moto::start`] with serve.py's options `args` (`--lag`,
    /// `--create`, …). The seed of its timing is `EBS_CSI_EC2_SEED` or a
    /// random one, printed (a failed test shows it; set it to replay).
    pub fn start_with(args: &[&str]) -> Self {
        Self::start_seeded(&Self::seed(), args)
    }

    /// `EBS_CSI_EC2_SEED` or a random seed, printed.
    fn seed() -> String {
        let seed = std::env::var("EBS_CSI_EC2_SEED").unwrap_or_else(|_| {
            let clock = std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .unwrap_or_default();
            (u64::from(std::process::id()) ^ u64::from(clock.subsec_nanos())).to_string()
        });
        eprintln!("moto: EBS_CSI_EC2_SEED={seed}");
        seed
    }

    /// [`Moto::start_with`] listening on `host` (an address of this
    /// machine: the real cluster's node address, which its pods reach).
    pub fn start_on(host: &str, args: &[&str]) -> Self {
        Self::start_seeded_on(host, &Self::seed(), args)
    }

    /// [`Moto::start_with`] with serve.py's timing seeded by `seed`.
    pub fn start_seeded(seed: &str, args: &[&str]) -> Self {
        Self::start_seeded_on("127.0.0.1", seed, args)
    }

    fn start_seeded_on(host: &str, seed: &str, args: &[&str]) -> Self {
        let port = TcpListener::bind((host, 0))
            .and_then(|l| l.local_addr())
            .expect("free port")
            .port();
        let dir = tempfile::Builder::new()
            .prefix("ebs-csi-moto-")
            .tempdir()
            .expect("tempdir");
        let child = Command::new(crate::venv_program("python"))
            .arg(crate::repository().join("tests/ec2/serve.py"))
            .arg(port.to_string())
            .args(["--host", host, "--seed", seed])
            .args(args)
            .current_dir(dir.path())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("moto_server");
        let moto = Self {
            child,
            _dir: dir,
            endpoint: format!("http://{host}:{port}"),
            host: host.to_owned(),
            port,
        };
        wait_until("moto to answer", Duration::from_secs(30), || {
            moto.http("GET", "/moto-api/", "").is_some()
        });
        moto
    }

    /// One HTTP/1.1 request; the body of a 2xx answer, `None` otherwise.
    pub fn http(&self, method: &str, path: &str, body: &str) -> Option<String> {
        let mut stream = TcpStream::connect((self.host.as_str(), self.port)).ok()?;
        let request = format!(
            "{method} {path} HTTP/1.1\r\nhost: 127.0.0.1\r\ncontent-type: application/x-www-form-urlencoded\r\n\
             authorization: AWS4-HMAC-SHA256 Credential=testing/20260101/us-east-1/ec2/aws4_request\r\n\
             content-length: {}\r\nconnection: close\r\n\r\n{body}",
            body.len()
        );
        stream.write_all(request.as_bytes()).ok()?;
        let mut response = String::new();
        stream.read_to_string(&mut response).ok()?;
        let ok = response.split(' ').nth(1).is_some_and(|code| code.starts_with('2'));
        ok.then(|| {
            response
                .split_once("\r\n\r\n")
                .map(|(_, b)| b.to_owned())
                .unwrap_or_default()
        })
    }

    /// An EC2 Query API call in `region`; returns the XML answer.
    pub fn ec2(&self, region: &str, action: &str, params: &[(&str, &str)]) -> String {
        let mut body = format!("Action={action}&Version=2016-11-15");
        for (k, v) in params {
            body.push_str(&format!("&{k}={v}"));
        }
        let mut stream = TcpStream::connect((self.host.as_str(), self.port)).expect("connect");
        let request = format!(
            "POST / HTTP/1.1\r\nhost: 127.0.0.1\r\ncontent-type: application/x-www-form-urlencoded\r\n\
             authorization: AWS4-HMAC-SHA256 Credential=testing/20260101/{region}/ec2/aws4_request\r\n\
             content-length: {}\r\nconnection: close\r\n\r\n{body}",
            body.len()
        );
        stream.write_all(request.as_bytes()).expect("write");
        let mut response = String::new();
        stream.read_to_string(&mut response).expect("read");
        response
    }

    /// DescribeVolumes of `volume_id` in `region`, asked again (for up to
    /// 10 s) until `settled` holds of the answer: serve.py, as EC2, shows a
    /// change only after its lag. Returns the answer that satisfied it.
    ///
    /// # Panics
    /// If the answer never satisfies `settled`.
    pub fn volume_once(&self, region: &str, volume_id: &str, settled: impl Fn(&str) -> bool) -> String {
        let deadline = std::time::Instant::now() + Duration::from_secs(10);
        loop {
            let xml = self.ec2(region, "DescribeVolumes", &[("VolumeId.1", volume_id)]);
            if settled(&xml) {
                return xml;
            }
            assert!(
                std::time::Instant::now() < deadline,
                "{volume_id} never settled:\n{xml}"
            );
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    /// Launches an instance in `zone` (of `region`) and returns its id.
    pub fn run_instance(&self, region: &str, zone: &str) -> String {
        let xml = self.ec2(
            region,
            "RunInstances",
            &[
                ("ImageId", "ami-03cf127a"),
                ("MinCount", "1"),
                ("MaxCount", "1"),
                ("InstanceType", "m5.large"),
                ("Placement.AvailabilityZone", zone),
            ],
        );
        xml_values(&xml, "instanceId").into_iter().next().expect("instance id")
    }

    /// Arms the fault `name` of `tests/ec2/serve.py` (`throttle`,
    /// `detach-available`, `token-mismatch`) for its next `count` calls.
    pub fn fault(&self, name: &str, count: usize) {
        self.http("POST", &format!("/_faults/{name}?count={count}"), "")
            .unwrap_or_else(|| panic!("arming fault {name}"));
    }

    /// How many calls the fault `name` has still to answer.
    pub fn fault_left(&self, name: &str) -> usize {
        let left = self.http("GET", &format!("/_faults/{name}"), "").expect("fault count");
        left.trim().parse().expect("a count")
    }

    /// Turns on EC2's request limits in `tests/ec2/serve.py` (a token
    /// bucket per action, full from now on).
    pub fn request_limits(&self) {
        self.http("POST", "/_request-limits", "")
            .expect("turning request limits on");
    }

    /// How many calls the request limits have throttled.
    pub fn throttled_by_limits(&self) -> usize {
        let throttled = self.http("GET", "/_request-limits", "").expect("throttled count");
        throttled.trim().parse().expect("a count")
    }

    /// Makes DescribeVolumeStatus report `volume_id` initializing
    /// (`progress` percent done, `seconds` left), or, with `None`,
    /// initialized again.
    pub fn set_initializing(&self, volume_id: &str, progress: Option<(u8, u32)>) {
        let done = match progress {
            Some((percent, seconds)) => self.http(
                "POST",
                &format!("/_initializing/{volume_id}?progress={percent}&seconds={seconds}"),
                "",
            ),
            None => self.http("DELETE", &format!("/_initializing/{volume_id}"), ""),
        };
        done.unwrap_or_else(|| panic!("setting the initialization of {volume_id}"));
    }

    /// Starts moto's request recorder.
    pub fn start_recording(&self) {
        self.http("POST", "/moto-api/recorder/reset-recording", "");
        self.http("POST", "/moto-api/recorder/start-recording", "")
            .expect("start recording");
    }

    /// Stops recording and counts the recorded requests whose body names
    /// an action starting with `prefix` (e.g. `Describe`).
    pub fn recorded(&self, prefix: &str) -> usize {
        self.recorded_bodies(prefix).len()
    }

    /// Stops recording and returns the bodies (form-encoded, as sent) of
    /// the recorded requests whose action starts with `prefix`.
    pub fn recorded_bodies(&self, prefix: &str) -> Vec<String> {
        self.recorded_requests(prefix)
            .into_iter()
            .map(|(body, _)| body)
            .collect()
    }

    /// Stops recording and returns the `User-Agent` header of each recorded
    /// request whose action starts with `prefix`.
    pub fn recorded_user_agents(&self, prefix: &str) -> Vec<String> {
        self.recorded_requests(prefix)
            .into_iter()
            .map(|(_, user_agent)| user_agent)
            .collect()
    }

    /// Stops recording and returns each recorded request whose action
    /// starts with `prefix`: its body and its `User-Agent` header (moto's
    /// recording: a JSON object a line).
    fn recorded_requests(&self, prefix: &str) -> Vec<(String, String)> {
        self.http("POST", "/moto-api/recorder/stop-recording", "")
            .expect("stop recording");
        let log = self
            .http("GET", "/moto-api/recorder/download-recording", "")
            .expect("recording");
        log.lines()
            .filter_map(|line| serde_json::from_str::<serde_json::Value>(line).ok())
            .map(|entry| {
                let text = |value: &serde_json::Value| value.as_str().unwrap_or_default().to_owned();
                (
                    base64_decode(&text(&entry["body"])),
                    text(&entry["headers"]["User-Agent"]),
                )
            })
            .filter(|(body, _)| body.starts_with(&format!("Action={prefix}")))
            .collect()
    }
}

impl Drop for Moto {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Decodes standard base64 (the recorder's request bodies), ignoring
/// padding; invalid characters are skipped.
fn base64_decode(text: &str) -> String {
    let value = |c: u8| match c {
        b'A'..=b'Z' => Some(c - b'A'),
        b'a'..=b'z' => Some(c - b'a' + 26),
        b'0'..=b'9' => Some(c - b'0' + 52),
        b'+' => Some(62),
        b'/' => Some(63),
        _ => None,
    };
    let sextets: Vec<u8> = text.bytes().filter_map(value).collect();
    let bytes: Vec<u8> = sextets
        .chunks(4)
        .flat_map(|chunk| {
            let n = chunk
                .iter()
                .enumerate()
                .fold(0u32, |acc, (i, s)| acc | (u32::from(*s) << (18 - 6 * i)));
            let count = chunk.len().saturating_sub(1);
            n.to_be_bytes()[1..].iter().take(count).copied().collect::<Vec<_>>()
        })
        .collect();
    String::from_utf8_lossy(&bytes).into_owned()
}

/// Points the AWS SDK of a child process at moto: the standard endpoint
/// setting, a region, static test credentials, no IMDS.
pub fn aws_env(command: &mut Command, endpoint: &str, region: &str) {
    command
        .env("AWS_ENDPOINT_URL_EC2", endpoint)
        .env("AWS_ENDPOINT_URL_EBS", endpoint)
        .env("AWS_REGION", region)
        .env("AWS_ACCESS_KEY_ID", "testing")
        .env("AWS_SECRET_ACCESS_KEY", "testing")
        .env("AWS_EC2_METADATA_DISABLED", "true")
        .env_remove("AWS_PROFILE");
}

/// Every `<tag>value</tag>` in an XML document, in order.
pub fn xml_values(xml: &str, tag: &str) -> Vec<String> {
    let open = format!("<{tag}>");
    xml.split(&open)
        .skip(1)
        .filter_map(|rest| rest.split_once(&format!("</{tag}>")).map(|(v, _)| v.to_owned()))
        .collect()
}

/// Asserts that the resource described in `xml` carries each tag of
/// `expected`, key and value as one pair (`<key>K</key><value>V</value>`).
pub fn assert_tags(xml: &str, expected: &[(&str, &str)]) {
    let tags: std::collections::HashMap<String, String> = xml
        .split("<key>")
        .skip(1)
        .filter_map(|rest| {
            let (key, rest) = rest.split_once("</key>")?;
            let value = rest.trim_start().strip_prefix("<value>")?.split_once("</value>")?.0;
            Some((key.to_owned(), value.to_owned()))
        })
        .collect();
    for (key, value) in expected {
        assert_eq!(tags.get(*key).map(String::as_str), Some(*value), "tag {key} in {xml}");
    }
}

/// The controller of a test: the real `ebs-csi-controller` binary against
/// moto in one region, serving SnapshotMetadata on a socket of its own.
pub struct Controller {
    /// Its CSI socket.
    pub socket: PathBuf,
    /// Its SnapshotMetadata socket (`--snapshot-metadata-endpoint`), when
    /// it serves one.
    pub metadata_socket: Option<PathBuf>,
    /// The process.
    pub process: Process,
}

impl Controller {
    /// Starts the controller against `moto` in `region` with `args`.
    pub fn start(sandbox: &Sandbox, moto: &Moto, region: &str, args: &[&str]) -> Self {
        Self::start_in(sandbox.path(), &moto.endpoint, region, args)
    }

    /// [`Controller::start`] for the sandbox at `dir` and the EC2 endpoint
    /// `endpoint`.
    pub fn start_in(dir: &Path, endpoint: &str, region: &str, args: &[&str]) -> Self {
        Self::launch(dir, args, |command| aws_env(command, endpoint, region))
    }

    /// [`Controller::start`] with `env` set too (`HTTP_PROXY`, …).
    pub fn start_with_env(sandbox: &Sandbox, moto: &Moto, region: &str, args: &[&str], env: &[(&str, &str)]) -> Self {
        Self::launch(sandbox.path(), args, |command| {
            aws_env(command, &moto.endpoint, region);
            command.envs(env.iter().copied());
        })
    }

    /// [`Controller::start`] with the endpoint in the Go driver's
    /// `AWS_EC2_ENDPOINT` instead of the SDK's `AWS_ENDPOINT_URL_EC2`.
    pub fn start_with_go_endpoint_variable(sandbox: &Sandbox, moto: &Moto, region: &str) -> Self {
        Self::launch(sandbox.path(), &[], |command| {
            aws_env(command, &moto.endpoint, region);
            command
                .env_remove("AWS_ENDPOINT_URL_EC2")
                .env("AWS_EC2_ENDPOINT", &moto.endpoint);
        })
    }

    fn launch(dir: &Path, args: &[&str], env: impl FnOnce(&mut Command)) -> Self {
        Self::launch_logging_to(dir, args, env, "controller.log")
    }

    fn launch_logging_to(dir: &Path, args: &[&str], env: impl FnOnce(&mut Command), log: &str) -> Self {
        let socket = dir.join("controller.sock");
        let metadata_socket = dir.join("snapshot-metadata.sock");
        let mut command = Command::new(binary("ebs-csi-controller"));
        command
            .arg("--endpoint")
            .arg(format!("unix://{}", socket.display()))
            .arg("--snapshot-metadata-endpoint")
            .arg(format!("unix://{}", metadata_socket.display()))
            .args(args);
        env(&mut command);
        let process = spawn("controller", command, dir.join(log), &socket);
        Self {
            socket,
            metadata_socket: Some(metadata_socket),
            process,
        }
    }

    /// SIGKILLs the controller started by [`Controller::start_in`] with
    /// these arguments and starts it again, its stderr now in `log` (in
    /// `dir`).
    pub fn kill_and_restart(&mut self, dir: &Path, endpoint: &str, region: &str, args: &[&str], log: &str) {
        self.process.kill();
        *self = Self::launch_logging_to(dir, args, |command| aws_env(command, endpoint, region), log);
    }

    /// A CSI Controller client.
    pub async fn client(&self) -> ControllerClient<Channel> {
        ControllerClient::new(channel(&self.socket).await)
    }

    /// A CSI Identity client.
    pub async fn identity(&self) -> IdentityClient<Channel> {
        IdentityClient::new(channel(&self.socket).await)
    }

    /// A client of the volume-modifier-for-k8s sidecar's service.
    pub async fn modifier(&self) -> ModifyClient<Channel> {
        ModifyClient::new(channel(&self.socket).await)
    }

    /// A CSI GroupController client.
    pub async fn groups(&self) -> GroupControllerClient<Channel> {
        GroupControllerClient::new(channel(&self.socket).await)
    }

    /// A channel to the SnapshotMetadata socket.
    ///
    /// # Panics
    /// If the controller serves none.
    pub async fn metadata_channel(&self) -> Channel {
        channel(self.metadata_socket.as_deref().expect("a SnapshotMetadata socket")).await
    }

    /// A CSI SnapshotMetadata client, on the socket of its own.
    pub async fn metadata(&self) -> SnapshotMetadataClient<Channel> {
        SnapshotMetadataClient::new(self.metadata_channel().await)
    }

    /// A CSI Identity client on the SnapshotMetadata socket.
    pub async fn metadata_identity(&self) -> IdentityClient<Channel> {
        IdentityClient::new(self.metadata_channel().await)
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn decodes_base64() {
        assert_eq!(
            super::base64_decode("QWN0aW9uPURlc2NyaWJlVm9sdW1lcyZWZXJzaW9uPTIwMTYtMTEtMTU="),
            "Action=DescribeVolumes&Version=2016-11-15"
        );
        assert_eq!(super::base64_decode("YWI="), "ab");
    }
}

//! The plugin jobs of `deploy/nomad`, started the way a Nomad client
//! starts a `raw_exec` task with a `csi_plugin` block
//! (Nomad ≥ 1.3, client/allocrunner/taskrunner/plugin_supervisor_hook.go
//! and client/pluginmanager/csimanager/volume.go):
//!
//! - the client (root) creates `<data_dir>/client` and, for the plugin,
//!   `<data_dir>/client/csi/plugins/<alloc-id>/` (where it dials
//!   `csi.sock`) and `<data_dir>/client/csi/node/<plugin-id>/`, all with
//!   `os.MkdirAll(…, 0700)`, owned by root;
//! - it runs the task's `command` and `args` (as root: the job names no
//!   `user`), with `${NOMAD_ALLOC_ID}` interpolated;
//! - staging and target paths it sends are built on the job's
//!   `stage_publish_base_dir`.
//!
//! The jobs' text is read by `deploy/validate.py`'s `tasks` (python-hcl2,
//! the tests' venv); the tests
//! replace only the client's `data_dir` (`/opt/nomad/data`), the binaries'
//! paths, and for the node the helper's socket and the agent's ids, with
//! the sandbox's.

use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::Command;

use crate::moto::{Controller, aws_env};
use crate::{AGENT_UID, Agent, Helper, binary, make_dir, repository, spawn, venv_program};

/// The client's `data_dir` the shipped files name.
pub const DATA_DIR: &str = "/opt/nomad/data";
/// The allocation id the tests' client gives the node plugin.
pub const NODE_ALLOC_ID: &str = "5f3e0a4c-1b2d-4e6f-8a9b-0c1d2e3f4a5b";
/// The allocation id the tests' client gives the controller plugin.
pub const CONTROLLER_ALLOC_ID: &str = "8d1c2b3a-4e5f-4a6b-9c7d-0e1f2a3b4c5d";
/// The agent's uid and gid the job runs it with.
const JOB_AGENT_ID: &str = "990";

/// The plugin task of a job: its `config.command`, `config.args` and
/// `csi_plugin.stage_publish_base_dir` (empty for the controller).
pub struct Task {
    /// The program Nomad runs.
    pub command: String,
    /// Its arguments, uninterpolated.
    pub args: Vec<String>,
    /// Where Nomad builds staging and target paths.
    pub stage_publish_base_dir: String,
}

/// The node job's file under `deploy/nomad`.
pub const NODE_JOB: &str = "ebs-csi-node.nomad.hcl";
/// The controller job's file under `deploy/nomad`.
pub const CONTROLLER_JOB: &str = "ebs-csi-controller.nomad.hcl";

/// Reads the plugin task of the shipped job `job` ([`NODE_JOB`] or
/// [`CONTROLLER_JOB`]).
pub fn task(job: &str) -> Task {
    // deploy/validate.py's own reading of the jobs (python-hcl2).
    let script = "import json, sys\n\
        sys.path.insert(0, sys.argv[1])\n\
        import validate\n\
        (_, _, (_, task)), = list(validate.tasks(sys.argv[2]))\n\
        print(json.dumps([task['config'][0]['command'], task['config'][0]['args'],\n\
              task['csi_plugin'][0].get('stage_publish_base_dir', '')]))";
    let output = Command::new(venv_program("python"))
        .args(["-c", script])
        .arg(repository().join("deploy"))
        .arg(job)
        .output()
        .expect("python-hcl2");
    assert!(output.status.success(), "{}", String::from_utf8_lossy(&output.stderr));
    let (command, args, stage_publish_base_dir) = serde_json::from_slice(&output.stdout).expect("the plugin task");
    Task {
        command,
        args,
        stage_publish_base_dir,
    }
}

/// A Nomad client's `data_dir` with the directories the client makes for
/// the node plugin (the operator pre-creates the plugin's, which the
/// helper's `--allowed-root` names, with the same owner and mode).
pub struct NomadClient {
    data_dir: PathBuf,
    /// `stage_publish_base_dir` on this client: the plugin's directory.
    pub plugin_dir: PathBuf,
}

impl NomadClient {
    /// Lays out `<sandbox_dir>/nomad/data` as the client does: root-owned
    /// 0700 directories down to each allocation's socket directory and the
    /// node plugin's directory.
    pub fn new(sandbox_dir: &Path) -> Self {
        let data_dir = sandbox_dir.join("nomad/data");
        let base = task(NODE_JOB).stage_publish_base_dir;
        let plugin_dir = PathBuf::from(base.replace(DATA_DIR, &data_dir.to_string_lossy()));
        let client = Self { data_dir, plugin_dir };
        let socket_dirs = [client.socket_dir(NODE_ALLOC_ID), client.socket_dir(CONTROLLER_ALLOC_ID)];
        for dir in socket_dirs.iter().chain([&client.plugin_dir]) {
            make_dir(dir);
            for level in dir
                .ancestors()
                .take_while(|level| level.starts_with(client.data_dir.join("client")))
            {
                std::fs::set_permissions(level, std::fs::Permissions::from_mode(0o700)).expect("chmod");
            }
        }
        client
    }

    fn socket_dir(&self, alloc_id: &str) -> PathBuf {
        self.data_dir.join("client/csi/plugins").join(alloc_id)
    }

    /// The task of `job` in allocation `alloc_id` as Nomad runs it (as
    /// root, `${NOMAD_ALLOC_ID}` interpolated), with the sandbox's binaries
    /// and `replace` applied to each argument; and the socket Nomad dials.
    fn command(&self, job: &str, alloc_id: &str, replace: impl Fn(String) -> String) -> (Command, PathBuf) {
        let task = task(job);
        let mut command = Command::new(&task.command);
        for arg in &task.args {
            let mut arg = arg
                .replace(DATA_DIR, &self.data_dir.to_string_lossy())
                .replace("${NOMAD_ALLOC_ID}", alloc_id);
            for name in ["ebs-csi-agent", "ebs-csi-controller"] {
                arg = arg.replace(&format!("/usr/bin/{name}"), &binary(name).to_string_lossy());
            }
            command.arg(replace(arg));
        }
        (command, self.socket_dir(alloc_id).join("csi.sock"))
    }

    /// Runs the controller task against the EC2 API at `endpoint` in
    /// `region` (moto); returns once its socket listens.
    pub fn start_controller_task(&self, sandbox_dir: &Path, endpoint: &str, region: &str) -> Controller {
        let (mut command, socket) = self.command(CONTROLLER_JOB, CONTROLLER_ALLOC_ID, |arg| arg);
        aws_env(&mut command, endpoint, region);
        let process = spawn(
            "nomad controller task",
            command,
            sandbox_dir.join("controller.log"),
            &socket,
        );
        Controller {
            socket,
            metadata_socket: None,
            process,
        }
    }

    /// Runs the node task (as root, its command line interpolated) against
    /// `helper`, with the sandbox's device tree and `agent_args` appended;
    /// returns once its socket listens.
    pub fn start_node_task(&self, sandbox_dir: &Path, helper: &Helper, agent_args: &[&str]) -> Agent {
        let agent_id = AGENT_UID.to_string();
        let (mut command, socket) = self.command(NODE_JOB, NODE_ALLOC_ID, |arg| {
            arg.replace("/run/ebs-csi/helper.sock", &helper.socket.to_string_lossy())
                .replace(&format!("={JOB_AGENT_ID}"), &format!("={agent_id}"))
        });
        command
            .arg("--dev-dir")
            .arg(make_dir(&sandbox_dir.join("dev")))
            .args(agent_args);
        let process = spawn("nomad node task", command, sandbox_dir.join("agent.log"), &socket);
        Agent { socket, process }
    }
}

/// Waits until the task `pid` has become `name` (the program setpriv
/// execs on the first connection), then asserts it runs as `uid`:`uid`
/// with no capability, an empty bounding set and no_new_privs.
pub fn assert_handed_over(pid: u32, name: &str, uid: u32) {
    let status_file = format!("/proc/{pid}/status");
    crate::wait_until(
        "the plugin to serve the socket",
        std::time::Duration::from_secs(5),
        || std::fs::read_to_string(&status_file).is_ok_and(|s| s.starts_with(&format!("Name:\t{name}\n"))),
    );
    let status = std::fs::read_to_string(&status_file).expect("status");
    for line in [
        format!("Uid:\t{uid}\t{uid}\t{uid}\t{uid}"),
        format!("Gid:\t{uid}\t{uid}\t{uid}\t{uid}"),
        "Groups:\t".to_owned(),
        "CapEff:\t0000000000000000".to_owned(),
        "CapBnd:\t0000000000000000".to_owned(),
        "NoNewPrivs:\t1".to_owned(),
    ] {
        assert!(
            status.lines().any(|l| l.trim_end() == line.trim_end()),
            "no {line:?} in\n{status}"
        );
    }
}

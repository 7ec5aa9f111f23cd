//! The node job of `deploy/nomad/ebs-csi-node.nomad.hcl`, started the way
//! a Nomad client starts a `raw_exec` task with a `csi_plugin` block
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
//! The job's text is read with python-hcl2 (the tests' venv); the test
//! replaces only the client's `data_dir` (`/opt/nomad/data`), the helper's
//! socket and the agent's ids with the sandbox's.

use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::Command;

use crate::{AGENT_UID, Agent, Helper, binary, make_dir, repository, spawn, venv_program};

/// The client's `data_dir` the shipped files name.
pub const DATA_DIR: &str = "/opt/nomad/data";
/// The allocation id the tests' client gives the plugin.
pub const ALLOC_ID: &str = "5f3e0a4c-1b2d-4e6f-8a9b-0c1d2e3f4a5b";
/// The agent's uid and gid the job runs it with.
const JOB_AGENT_ID: &str = "990";

/// The node task of the job: its `config.command`, `config.args` and
/// `csi_plugin.stage_publish_base_dir`.
pub struct NodeTask {
    /// The program Nomad runs.
    pub command: String,
    /// Its arguments, uninterpolated.
    pub args: Vec<String>,
    /// Where Nomad builds staging and target paths.
    pub stage_publish_base_dir: String,
}

/// Reads the node task from the shipped job.
pub fn node_task() -> NodeTask {
    let script = "import hcl2, json, sys\n\
        from hcl2.utils import SerializationOptions\n\
        options = SerializationOptions(strip_string_quotes=True, explicit_blocks=False, with_comments=False)\n\
        job = hcl2.load(open(sys.argv[1]), serialization_options=options)['job'][0]\n\
        task = list(list(job.values())[0]['group'][0].values())[0]['task'][0]\n\
        task = list(task.values())[0]\n\
        print(json.dumps([task['config'][0]['command'], task['config'][0]['args'],\n\
              task['csi_plugin'][0]['stage_publish_base_dir']]))";
    let output = Command::new(venv_program("python"))
        .args(["-c", script])
        .arg(repository().join("deploy/nomad/ebs-csi-node.nomad.hcl"))
        .output()
        .expect("python-hcl2");
    assert!(output.status.success(), "{}", String::from_utf8_lossy(&output.stderr));
    let (command, args, stage_publish_base_dir) = serde_json::from_slice(&output.stdout).expect("the node task");
    NodeTask {
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
    task: NodeTask,
}

impl NomadClient {
    /// Lays out `<sandbox_dir>/nomad/data` as the client does: root-owned
    /// 0700 directories down to the allocation's socket directory and the
    /// plugin's directory.
    pub fn new(sandbox_dir: &Path) -> Self {
        let data_dir = sandbox_dir.join("nomad/data");
        let task = node_task();
        let plugin_dir = PathBuf::from(
            task.stage_publish_base_dir
                .replace(DATA_DIR, &data_dir.to_string_lossy()),
        );
        let client = Self {
            data_dir,
            plugin_dir,
            task,
        };
        for dir in [&client.socket_dir(), &client.plugin_dir] {
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

    fn socket_dir(&self) -> PathBuf {
        self.data_dir.join("client/csi/plugins").join(ALLOC_ID)
    }

    /// Runs the node task (as root, its command line interpolated) against
    /// `helper`, with the sandbox's device tree and `agent_args` appended;
    /// returns once its socket listens.
    pub fn start_node_task(&self, sandbox_dir: &Path, helper: &Helper, agent_args: &[&str]) -> Agent {
        let agent_id = AGENT_UID.to_string();
        let args: Vec<String> = self
            .task
            .args
            .iter()
            .map(|a| {
                a.replace(DATA_DIR, &self.data_dir.to_string_lossy())
                    .replace("${NOMAD_ALLOC_ID}", ALLOC_ID)
                    .replace("/run/ebs-csi/helper.sock", &helper.socket.to_string_lossy())
                    .replace(&format!("={JOB_AGENT_ID}"), &format!("={agent_id}"))
                    .replace("/usr/bin/ebs-csi-agent", &binary("ebs-csi-agent").to_string_lossy())
            })
            .collect();
        let mut command = Command::new(&self.task.command);
        command
            .args(args)
            .arg("--dev-dir")
            .arg(make_dir(&sandbox_dir.join("dev")))
            .args(agent_args);
        let socket = self.socket_dir().join("csi.sock");
        let process = spawn("nomad node task", command, sandbox_dir.join("agent.log"), &socket);
        Agent { socket, process }
    }
}

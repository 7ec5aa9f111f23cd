# The CSI Node service on every client: the unprivileged agent, run by
# raw_exec (no Docker, no `privileged`). The privileged work is done by the
# host's ebs-csi-helper systemd unit, whose --allowed-root must be this
# plugin's directory on the host, <data_dir>/client/csi/node/aws-ebs0 (see
# ebs-csi-helper-nomad.conf).
#
# Nomad dials <data_dir>/client/csi/plugins/<alloc id>/csi.sock, in a
# directory it creates root-only (0700): only root can make that socket.
# So the task starts as root only to run systemd-socket-activate, which
# binds the socket and, on Nomad's first connection, execs setpriv, which
# drops to uid/gid 990 (ebs-csi-agent:ebs-csi) with no capability and no
# way to regain one, and execs the agent, which serves the socket it was
# handed (LISTEN_FDS). With raw_exec the staging and target paths Nomad
# sends are built on stage_publish_base_dir as they are: it is set to the
# plugin's host directory, so they are host paths beneath the helper's
# allowed root. Edit /opt/nomad/data if the client's data_dir differs.
job "ebs-csi-node" {
  type        = "system"
  datacenters = ["*"]

  group "node" {
    task "agent" {
      driver = "raw_exec"

      config {
        command = "/usr/bin/systemd-socket-activate"
        args = [
          "--listen=/opt/nomad/data/client/csi/plugins/${NOMAD_ALLOC_ID}/csi.sock",
          "/usr/bin/setpriv", "--reuid=990", "--regid=990", "--clear-groups",
          "--inh-caps=-all", "--bounding-set=-all", "--no-new-privs", "--",
          "/usr/bin/ebs-csi-agent", "--helper-socket", "/run/ebs-csi/helper.sock",
        ]
      }

      csi_plugin {
        id                     = "aws-ebs0"
        type                   = "node"
        mount_dir              = "/csi"
        stage_publish_base_dir = "/opt/nomad/data/client/csi/node/aws-ebs0"
        health_timeout         = "30s"
      }

      resources {
        cpu    = 50
        memory = 32
      }
    }
  }
}

# The CSI Node service on every client: the unprivileged agent, run by
# raw_exec as the ebs-csi-agent user (no Docker, no `privileged`). The
# privileged work is done by the host's ebs-csi-helper systemd unit, whose
# --allowed-root must be this plugin's directory on the host,
# <data_dir>/client/csi/node/aws-ebs0 (see ebs-csi-helper-nomad.conf).
# raw_exec has no filesystem isolation, so Nomad hands the agent host
# paths beneath that directory and sets CSI_ENDPOINT to the host socket.
job "ebs-csi-node" {
  type        = "system"
  datacenters = ["*"]

  group "node" {
    task "agent" {
      driver = "raw_exec"
      user   = "ebs-csi-agent"

      config {
        command = "/usr/bin/ebs-csi-agent"
        args    = ["--helper-socket", "/run/ebs-csi/helper.sock"]
      }

      csi_plugin {
        id                     = "aws-ebs0"
        type                   = "node"
        mount_dir              = "/csi"
        stage_publish_base_dir = "/local/csi"
        health_timeout         = "30s"
      }

      resources {
        cpu    = 50
        memory = 32
      }
    }
  }
}

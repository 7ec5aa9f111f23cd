# The CSI Controller service: the only part that calls EC2; its
# credentials come from the instance profile of the Nomad client it lands
# on (IMDS). As in the node job, Nomad dials
# <data_dir>/client/csi/plugins/<alloc id>/csi.sock in a root-only (0700)
# directory: the task starts as root (raw_exec) only to run
# systemd-socket-activate, which binds that socket, then setpriv, which
# runs the controller as nobody (65534) with no capability and
# no_new_privs; the controller serves the socket it was handed.
job "ebs-csi-controller" {
  type        = "service"
  datacenters = ["*"]

  group "controller" {
    count = 2

    constraint {
      distinct_hosts = true
    }

    task "controller" {
      driver = "raw_exec"

      config {
        command = "/usr/bin/systemd-socket-activate"
        args = [
          "--listen=/opt/nomad/data/client/csi/plugins/${NOMAD_ALLOC_ID}/csi.sock",
          "/usr/bin/setpriv", "--reuid=65534", "--regid=65534", "--clear-groups",
          "--inh-caps=-all", "--bounding-set=-all", "--no-new-privs", "--",
          "/usr/bin/ebs-csi-controller", "--k8s-tag-cluster-id", "nomad",
        ]
      }

      csi_plugin {
        id             = "aws-ebs0"
        type           = "controller"
        mount_dir      = "/csi"
        health_timeout = "30s"
      }

      resources {
        cpu    = 100
        memory = 64
      }
    }
  }
}

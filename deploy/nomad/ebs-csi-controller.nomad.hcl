# The CSI Controller service: the only part that calls EC2. It runs
# isolated (exec driver) as a dynamic, unprivileged user; its credentials
# come from the instance profile of the Nomad client it lands on (IMDS).
# Nomad sets CSI_ENDPOINT to the socket in mount_dir; the controller
# serves there.
job "ebs-csi-controller" {
  type        = "service"
  datacenters = ["*"]

  group "controller" {
    count = 2

    constraint {
      distinct_hosts = true
    }

    task "controller" {
      driver = "exec"
      user   = "nobody"

      config {
        command = "/usr/bin/ebs-csi-controller"
        args    = ["--k8s-tag-cluster-id", "nomad"]
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

# A job that claims the volume of volume.hcl and appends to a file on it.
job "ebs-writer" {
  type        = "service"
  datacenters = ["*"]

  group "writer" {
    volume "data" {
      type            = "csi"
      source          = "data"
      access_mode     = "single-node-writer"
      attachment_mode = "file-system"
    }

    task "writer" {
      driver = "exec"

      volume_mount {
        volume      = "data"
        destination = "/data"
      }

      config {
        command = "/bin/sh"
        args    = ["-c", "while true; do date >> /data/out.txt; sleep 5; done"]
      }
    }
  }
}

# `nomad volume create deploy/nomad/volume.hcl`: a 10 GiB encrypted gp3
# volume in us-east-1a, formatted ext4 on first use.
id        = "data"
name      = "data"
type      = "csi"
plugin_id = "aws-ebs0"

capacity_min = "10GiB"
capacity_max = "10GiB"

capability {
  access_mode     = "single-node-writer"
  attachment_mode = "file-system"
}

mount_options {
  fs_type     = "ext4"
  mount_flags = ["noatime"]
}

parameters {
  type      = "gp3"
  encrypted = "true"
}

topology_request {
  required {
    topology {
      segments = {
        "topology.ebs.csi.aws.com/zone" = "us-east-1a"
      }
    }
  }
}

//! The shapes of the staging and target paths an orchestrator gives a CSI
//! plugin: the helper mounts nowhere else beneath its roots (everything
//! else there belongs to the orchestrator or to other workloads: another
//! pod's configMap directory, its `etc-hosts`, `pods/` itself).

/// The CSI driver name kubelet puts in staging paths (the agent's
/// `ebs_csi_proto::DRIVER_NAME`; the helper links no gRPC code).
pub const DRIVER_NAME: &str = "ebs.csi.aws.com";

/// Whose paths lie beneath the allowed roots (`--allowed-layout`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, clap::ValueEnum)]
pub enum Layout {
    /// kubelet's, beneath its root directory (`/var/lib/kubelet`).
    #[default]
    Kubelet,
    /// Nomad's, beneath the plugin's `stage_publish_base_dir` on the host.
    Nomad,
    /// For tests only, never on a node: the paths of csi-test's csi-sanity
    /// (`pkg/sanity`) run with `-csi.stagingdir <root>/csi-staging` and
    /// `-csi.mountdir <root>/csi-mount` — which are kubelet's and Nomad's
    /// shapes it cannot make. Bound to no volume; the helper warns at
    /// start.
    CsiSanity,
}

/// kubelet's record of a volume, beside its staging path and targets.
pub const RECORD: &str = "vol_data.json";

/// What binds a path to a volume ([`Layout::binding`]).
#[derive(Debug, PartialEq, Eq)]
pub struct Binding<'p> {
    /// The path's hash component, sha256 of the volume id in lower-case
    /// hex, where it has one.
    pub hash: Option<&'p str>,
    /// kubelet's record of the volume, as components beneath the root.
    pub record: Vec<&'p str>,
}

/// What a path is for in a request.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Role {
    /// A filesystem volume's staging path (Stage, Unstage, Publish's source).
    Staging,
    /// kubelet's staging path of a raw block volume (Unstage), where
    /// nothing is staged: the agent publishes such a volume from its device.
    BlockStaging,
    /// A filesystem volume's target path (Publish of a staged volume).
    Target,
    /// A raw block volume's target path (Publish of a device).
    BlockTarget,
    /// A target of either kind (Unpublish).
    AnyTarget,
    /// A staging or target path (Expand).
    Volume,
    /// A staging or target path, or kubelet's map of a raw block volume
    /// into a pod (VolumeStats).
    Stats,
}

impl Layout {
    /// Whether `below`, the components beneath a root, is a path of `role`:
    /// - kubelet (kubernetes `pkg/volume/csi/`): staging
    ///   `plugins/kubernetes.io/csi/<driver>/<sha256 hex of the volume
    ///   handle>/globalmount` (`csi_attacher.go`, `MakeDeviceMountPath`;
    ///   Kubernetes 1.24 and later, and the minimum is 1.33); target `pods/<pod uid>/volumes/kubernetes.io~csi/<pv>/mount`
    ///   (`csi_mounter.go`, `GetPath`); raw block target
    ///   `plugins/kubernetes.io/csi/volumeDevices/publish/<pv>/<pod uid>`
    ///   (`csi_block.go`, `getPublishPath`); raw block staging
    ///   `plugins/kubernetes.io/csi/volumeDevices/staging/<pv>`
    ///   (`csi_block.go`, `getStagingPath`); a raw block volume's map into
    ///   a pod, `plugins/kubernetes.io/csi/volumeDevices/<pv>/dev/<pod uid>`
    ///   (`csi_plugin.go`, `GetGlobalMapPath`, plus the pod's uid: kubelet
    ///   bind-mounts the device there, `MapBlockVolume`), the path
    ///   kubelet's NodeGetVolumeStats names for such a volume;
    /// - Nomad (`client/pluginmanager/csimanager/volume.go`): staging
    ///   `staging/<namespace>/<volume>/<usage>` (`stagingDirForVolume`; the
    ///   namespace came with Nomad 1.5's per-namespace volume ids, before it
    ///   `staging/<volume>/<usage>`), target of either kind
    ///   `per-alloc/<alloc>/<volume>/<usage>` (`targetForVolume`);
    /// - csi-sanity (csi-test v5 `pkg/sanity/node.go`): staging its
    ///   staging directory itself, `csi-staging`; target of either kind
    ///   `csi-mount/target` (`sc.TargetPath + "/target"`).
    ///
    /// Components are non-empty and never `.` or `..` (checked before).
    pub fn accepts(self, role: Role, below: &[&str]) -> bool {
        let staging = || self.is_staging(below);
        let target = || self.is_target(below);
        let block = || self.is_block_target(below);
        match role {
            Role::Staging => staging(),
            Role::BlockStaging => matches!(
                (self, below),
                (
                    Self::Kubelet,
                    ["plugins", "kubernetes.io", "csi", "volumeDevices", "staging", _]
                )
            ),
            Role::Target => target(),
            Role::BlockTarget => block(),
            Role::AnyTarget => target() || block(),
            Role::Volume => staging() || target() || block(),
            Role::Stats => staging() || target() || block() || self.is_block_map(below),
        }
    }

    fn is_block_map(self, below: &[&str]) -> bool {
        matches!(
            (self, below),
            (
                Self::Kubelet,
                ["plugins", "kubernetes.io", "csi", "volumeDevices", _, "dev", _]
            )
        )
    }

    fn is_staging(self, below: &[&str]) -> bool {
        match (self, below) {
            (Self::Kubelet, ["plugins", "kubernetes.io", "csi", driver, hash, "globalmount"]) => {
                *driver == DRIVER_NAME && hash.len() == 64 && hash.bytes().all(|b| b.is_ascii_hexdigit())
            }
            (Self::Nomad, ["staging", _, _] | ["staging", _, _, _]) | (Self::CsiSanity, ["csi-staging"]) => true,
            _ => false,
        }
    }

    /// What binds `below`, a path of this layout (as [`Layout::accepts`]
    /// judged it), to the volume it may hold; `None` where nothing does.
    /// kubelet's paths (kubernetes `pkg/volume/csi/`, `../shared/DESIGN.md`
    /// §12): a staging path's hash is sha256 of the volume handle, and
    /// kubelet writes its record of the volume (`vol_data.json`: the
    /// driver's name, the volume handle) before it asks the plugin to stage
    /// or publish — beside the staging path (`csi_attacher.go`,
    /// `MountDevice`), in the target's parent (`csi_mounter.go`, `SetUpAt`)
    /// and, for a raw block target, in `volumeDevices/<pv>/data`
    /// (`csi_block.go`, `SetUpDevice`). Nomad's paths carry Nomad's own
    /// volume id, which need not be the EBS volume's, and it keeps no record
    /// beside them.
    pub fn binding<'p>(self, below: &[&'p str]) -> Option<Binding<'p>> {
        let (hash, record) = match (self, below) {
            (Self::Kubelet, [plugins, k8s, csi, driver, hash, "globalmount"]) => {
                (Some(*hash), vec![*plugins, *k8s, *csi, *driver, *hash, RECORD])
            }
            (Self::Kubelet, [pods, pod, volumes, csi, pv, "mount"]) => {
                (None, vec![*pods, *pod, *volumes, *csi, *pv, RECORD])
            }
            (Self::Kubelet, [plugins, k8s, csi, "volumeDevices", "publish", pv, _]) => {
                (None, vec![*plugins, *k8s, *csi, "volumeDevices", *pv, "data", RECORD])
            }
            _ => return None,
        };
        Some(Binding { hash, record })
    }

    /// Whether `target`, a filesystem target path of this layout, may take
    /// a bind of the volume staged at `staging`, a staging path of it (both
    /// as [`Layout::accepts`] judged them): Nomad's carry Nomad's volume id
    /// and the claim's usage (`staging/[<namespace>/]<volume>/<usage>`,
    /// `per-alloc/<alloc>/<volume>/<usage>`; `volume.go`,
    /// `stagingDirForVolume`, `targetForVolume`), which must be the same in
    /// both (third audit A2, Nomad's layout); kubelet's are bound to the
    /// volume by its records instead ([`Layout::binding`]).
    pub fn publishes(self, staging: &[&str], target: &[&str]) -> bool {
        match (self, staging, target) {
            (Self::Kubelet | Self::CsiSanity, _, _) => true,
            (Self::Nomad, [.., volume, usage], ["per-alloc", _, target_volume, target_usage]) => {
                (volume, usage) == (target_volume, target_usage)
            }
            (Self::Nomad, _, _) => false,
        }
    }

    /// Whether the helper creates a missing parent of a target: Nomad's
    /// (its per-allocation directories), not kubelet's, which kubelet makes
    /// itself before it asks to publish (mode 0750; `csi_mounter.go`,
    /// `csi_block.go`): a missing one names no pod kubelet knows.
    pub fn creates_target_parents(self) -> bool {
        self == Self::Nomad
    }

    fn is_target(self, below: &[&str]) -> bool {
        matches!(
            (self, below),
            (Self::Kubelet, ["pods", _, "volumes", "kubernetes.io~csi", _, "mount"])
                | (Self::Nomad, ["per-alloc", _, _, _])
                | (Self::CsiSanity, ["csi-mount", "target"])
        )
    }

    fn is_block_target(self, below: &[&str]) -> bool {
        matches!(
            (self, below),
            (
                Self::Kubelet,
                ["plugins", "kubernetes.io", "csi", "volumeDevices", "publish", _, _]
            ) | (Self::Nomad, ["per-alloc", _, _, _])
                | (Self::CsiSanity, ["csi-mount", "target"])
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parts(path: &str) -> Vec<&str> {
        path.split('/').collect()
    }

    #[test]
    fn kubelets_shapes_and_nothing_else() {
        let hash = "a".repeat(64);
        let staging = format!("plugins/kubernetes.io/csi/ebs.csi.aws.com/{hash}/globalmount");
        let kubelet = |role, path: &str| Layout::Kubelet.accepts(role, &parts(path));
        assert!(kubelet(Role::Staging, &staging));
        assert!(kubelet(Role::Target, "pods/uid/volumes/kubernetes.io~csi/pv-1/mount"));
        assert!(kubelet(
            Role::BlockTarget,
            "plugins/kubernetes.io/csi/volumeDevices/publish/pv-1/uid"
        ));
        assert!(kubelet(
            Role::AnyTarget,
            "pods/uid/volumes/kubernetes.io~csi/pv-1/mount"
        ));
        assert!(kubelet(Role::Volume, &staging));
        let block_staging = "plugins/kubernetes.io/csi/volumeDevices/staging/pv-1";
        assert!(kubelet(Role::BlockStaging, block_staging));
        assert!(!kubelet(Role::Staging, block_staging), "nothing is staged there");
        assert!(!kubelet(Role::BlockStaging, &staging));
        assert!(!kubelet(
            Role::BlockStaging,
            "plugins/kubernetes.io/csi/volumeDevices/staging/pv-1/x"
        ));
        assert!(!Layout::Nomad.accepts(Role::BlockStaging, &parts("staging/vol/rw")));
        // kubelet's map of a raw block volume into a pod: VolumeStats only.
        let block_map = "plugins/kubernetes.io/csi/volumeDevices/pv-1/dev/uid";
        assert!(kubelet(Role::Stats, block_map));
        assert!(kubelet(Role::Stats, &staging));
        for role in [
            Role::Staging,
            Role::BlockStaging,
            Role::Target,
            Role::BlockTarget,
            Role::AnyTarget,
            Role::Volume,
        ] {
            assert!(!kubelet(role, block_map), "{role:?}");
        }
        assert!(!kubelet(
            Role::Stats,
            "plugins/kubernetes.io/csi/volumeDevices/pv-1/data/uid"
        ));
        assert!(!kubelet(
            Role::Stats,
            "plugins/kubernetes.io/csi/volumeDevices/pv-1/dev"
        ));
        for refused in [
            "pods",
            "pods/uid/etc-hosts",
            "pods/uid/volumes/kubernetes.io~configmap/cfg",
            "pods/uid/volumes/kubernetes.io~csi/pv-1",
            "pods/uid/volumes/kubernetes.io~csi/pv-1/mount/x",
            "plugins/kubernetes.io/csi/efs.csi.aws.com/{hash}/globalmount",
            "plugins/kubernetes.io/csi/ebs.csi.aws.com/short/globalmount",
            "plugins/kubernetes.io/csi/pv/pv-1/globalmount",
            "plugins/ebs.csi.aws.com/staging",
            "pki/x",
        ] {
            let path = refused.replace("{hash}", &hash);
            assert!(!kubelet(Role::Volume, &path), "{path}");
        }
        assert!(!kubelet(Role::Target, &staging), "a staging path is no target");
        assert!(!kubelet(Role::Staging, "pods/uid/volumes/kubernetes.io~csi/pv-1/mount"));
        assert!(!Layout::Kubelet.accepts(Role::Staging, &parts("staging/vol/rw-file-system")));
    }

    #[test]
    fn kubelets_paths_are_bound_by_hash_and_record_nomads_are_not() {
        let hash = "a".repeat(64);
        let staging = format!("plugins/kubernetes.io/csi/ebs.csi.aws.com/{hash}/globalmount");
        assert_eq!(
            Layout::Kubelet.binding(&parts(&staging)),
            Some(Binding {
                hash: Some(&hash),
                record: parts(&format!(
                    "plugins/kubernetes.io/csi/ebs.csi.aws.com/{hash}/vol_data.json"
                )),
            })
        );
        assert_eq!(
            Layout::Kubelet.binding(&parts("pods/uid/volumes/kubernetes.io~csi/pv-1/mount")),
            Some(Binding {
                hash: None,
                record: parts("pods/uid/volumes/kubernetes.io~csi/pv-1/vol_data.json"),
            })
        );
        assert_eq!(
            Layout::Kubelet.binding(&parts("plugins/kubernetes.io/csi/volumeDevices/publish/pv-1/uid")),
            Some(Binding {
                hash: None,
                record: parts("plugins/kubernetes.io/csi/volumeDevices/pv-1/data/vol_data.json"),
            })
        );
        let usage = "rw-file-system-single-node-writer";
        assert_eq!(Layout::Nomad.binding(&parts(&format!("staging/vol-a/{usage}"))), None);
        assert_eq!(
            Layout::Nomad.binding(&parts(&format!("per-alloc/alloc-1/vol-a/{usage}"))),
            None
        );
        assert!(!Layout::Kubelet.creates_target_parents());
        assert!(Layout::Nomad.creates_target_parents());
    }

    #[test]
    fn nomads_target_takes_only_the_volume_staged_for_it() {
        let usage = "rw-file-system-single-node-writer";
        let (staging, namespaced) = (
            format!("staging/vol-a/{usage}"),
            format!("staging/default/vol-a/{usage}"),
        );
        let publishes = |staging: &str, target: &str| Layout::Nomad.publishes(&parts(staging), &parts(target));
        assert!(publishes(&staging, &format!("per-alloc/alloc-1/vol-a/{usage}")));
        assert!(publishes(&namespaced, &format!("per-alloc/alloc-1/vol-a/{usage}")));
        assert!(!publishes(&namespaced, &format!("per-alloc/alloc-1/vol-b/{usage}")));
        assert!(!publishes(
            &namespaced,
            "per-alloc/alloc-1/vol-a/ro-file-system-multi-node-reader-only"
        ));
        assert!(Layout::Kubelet.publishes(&parts("a"), &parts("b")));
    }

    #[test]
    fn csi_sanitys_shapes_and_nothing_else() {
        let sanity = |role, path: &str| Layout::CsiSanity.accepts(role, &parts(path));
        assert!(sanity(Role::Staging, "csi-staging"));
        assert!(sanity(Role::Target, "csi-mount/target"));
        assert!(sanity(Role::BlockTarget, "csi-mount/target"));
        assert!(!sanity(Role::Target, "csi-staging"));
        assert!(!sanity(Role::Staging, "csi-mount/target"));
        for refused in [
            "csi-mount",
            "csi-staging/x",
            "csi-mount/target/x",
            "pods/uid/volumes/kubernetes.io~csi/pv-1/mount",
        ] {
            assert!(!sanity(Role::Volume, refused), "{refused}");
        }
        assert_eq!(Layout::CsiSanity.binding(&parts("csi-mount/target")), None);
        assert!(Layout::CsiSanity.publishes(&parts("csi-staging"), &parts("csi-mount/target")));
        assert!(!Layout::CsiSanity.creates_target_parents());
    }

    #[test]
    fn nomads_shapes_and_nothing_else() {
        let nomad = |role, path: &str| Layout::Nomad.accepts(role, &parts(path));
        let usage = "rw-file-system-single-node-writer";
        assert!(nomad(Role::Staging, &format!("staging/vol-a/{usage}")));
        assert!(nomad(Role::Staging, &format!("staging/default/vol-a/{usage}")));
        assert!(nomad(Role::Target, &format!("per-alloc/alloc-1/vol-a/{usage}")));
        assert!(nomad(Role::BlockTarget, &format!("per-alloc/alloc-1/vol-a/{usage}")));
        assert!(!nomad(Role::Target, &format!("staging/vol-a/{usage}")));
        assert!(!nomad(Role::Staging, "staging/vol-a"));
        assert!(!nomad(Role::Volume, "per-alloc/alloc-1/vol-a"));
        assert!(!nomad(Role::Volume, "pods/uid/volumes/kubernetes.io~csi/pv-1/mount"));
    }
}

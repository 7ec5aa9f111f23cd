//! The local attach simulator: plays the EC2 hypervisor for one demo
//! instance.
//!
//! It follows the emulated EC2's attachments for the instance
//! (DescribeVolumes) and, for each attached volume, keeps a sparse backing
//! file named after the volume id and sized as the volume, a loop device
//! over it, and the links udev would create for an EBS volume
//! (`disk/by-id/nvme-Amazon_Elastic_Block_Store_vol…` and the `xvd…` name
//! given to AttachVolume) in its device tree. On detach it removes the
//! links and the loop device; when the volume is deleted, the file. It
//! keeps snapshot contents (moto keeps none), so a volume created from a
//! snapshot starts with the snapshot's data and serve.py can list a
//! snapshot's blocks (EBS direct APIs), and grows a backing file when
//! the volume is modified to a larger size.

use std::collections::{HashMap, HashSet};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use aws_sdk_ec2::Client;
use aws_sdk_ec2::types::VolumeAttachmentState;

/// Where the simulator keeps things.
#[derive(Clone, Debug)]
pub struct SimConfig {
    /// The instance whose attachments are simulated.
    pub instance_id: String,
    /// The device tree the agent looks in (`--dev-dir`).
    pub dev_dir: PathBuf,
    /// Backing files: `volumes/<vol-id>.img`, `snapshots/<snap-id>.img`.
    pub data_dir: PathBuf,
    /// How often EC2 is polled.
    pub poll: Duration,
}

/// A volume attached to the simulated instance.
#[derive(Clone, Debug, PartialEq, Eq)]
struct Attached {
    device_name: String,
    size_gib: i32,
    snapshot_id: Option<String>,
}

/// A volume the simulator has a loop device for.
#[derive(Debug)]
struct Local {
    loop_device: PathBuf,
    links: Vec<PathBuf>,
    size_gib: i32,
}

/// The simulator's state between polls.
pub struct Simulator {
    config: SimConfig,
    ec2: Client,
    local: HashMap<String, Local>,
    snapshots: HashSet<String>,
}

type SimResult<T> = Result<T, String>;

impl Simulator {
    /// A simulator over `ec2` with `config`; creates its directories.
    ///
    /// # Errors
    /// A message when a directory cannot be created.
    pub fn new(ec2: Client, config: SimConfig) -> SimResult<Self> {
        for dir in [
            config.data_dir.join("volumes"),
            config.data_dir.join("snapshots"),
            config.dev_dir.join("disk/by-id"),
        ] {
            std::fs::create_dir_all(&dir).map_err(|e| format!("creating {}: {e}", dir.display()))?;
        }
        Ok(Self {
            config,
            ec2,
            local: HashMap::new(),
            snapshots: HashSet::new(),
        })
    }

    fn volume_file(&self, volume_id: &str) -> PathBuf {
        self.config.data_dir.join("volumes").join(format!("{volume_id}.img"))
    }

    fn snapshot_file(&self, snapshot_id: &str) -> PathBuf {
        self.config
            .data_dir
            .join("snapshots")
            .join(format!("{snapshot_id}.img"))
    }

    /// One round: capture new snapshots, then bring attachments, sizes and
    /// deletions in line with EC2.
    ///
    /// # Errors
    /// A message naming the EC2 call or local step that failed.
    pub async fn poll_once(&mut self) -> SimResult<()> {
        self.capture_snapshots().await?;
        let (attached, existing) = self.describe().await?;
        for (volume_id, want) in &attached {
            self.attach(volume_id, want)?;
        }
        let gone: Vec<String> = self
            .local
            .keys()
            .filter(|id| !attached.contains_key(*id))
            .cloned()
            .collect();
        for volume_id in gone {
            self.detach(&volume_id);
        }
        for entry in std::fs::read_dir(self.config.data_dir.join("volumes"))
            .map_err(|e| e.to_string())?
            .flatten()
        {
            let name = entry.file_name().to_string_lossy().trim_end_matches(".img").to_owned();
            if !existing.contains(&name) {
                tracing::info!(volume_id = %name, "volume deleted: removing its backing file");
                let _ = std::fs::remove_file(entry.path());
            }
        }
        Ok(())
    }

    /// Copies the data of every new snapshot from its source volume.
    async fn capture_snapshots(&mut self) -> SimResult<()> {
        let out = self
            .ec2
            .describe_snapshots()
            .owner_ids("self")
            .send()
            .await
            .map_err(|e| format!("DescribeSnapshots: {e}"))?;
        for snapshot in out.snapshots() {
            let (Some(id), Some(volume_id)) = (snapshot.snapshot_id(), snapshot.volume_id()) else {
                continue;
            };
            if !self.snapshots.contains(id) {
                self.capture(id, volume_id, snapshot.volume_size().unwrap_or_default())?;
            }
        }
        Ok(())
    }

    /// Copies the volume's backing file (or, for a volume never attached,
    /// a blank file of `size_gib`) to the snapshot's file: under a
    /// temporary name, then renamed, so that a reader (serve.py's EBS
    /// direct APIs) never sees a copy half made.
    fn capture(&mut self, snapshot_id: &str, volume_id: &str, size_gib: i32) -> SimResult<()> {
        let source = self.volume_file(volume_id);
        let image = self.snapshot_file(snapshot_id);
        let partial = image.with_extension("partial");
        tracing::info!(snapshot_id, volume_id, "capturing snapshot contents");
        if source.exists() {
            run(
                "cp",
                &["--sparse=always", &source.to_string_lossy(), &partial.to_string_lossy()],
            )?;
        } else {
            std::fs::File::create(&partial)
                .and_then(|f| f.set_len(u64::try_from(size_gib).unwrap_or_default() << 30))
                .map_err(|e| format!("{}: {e}", partial.display()))?;
        }
        std::fs::rename(&partial, &image).map_err(|e| format!("{}: {e}", image.display()))?;
        self.snapshots.insert(snapshot_id.to_owned());
        Ok(())
    }

    /// The volumes attached to the instance, and the ids of all volumes.
    async fn describe(&self) -> SimResult<(HashMap<String, Attached>, HashSet<String>)> {
        let mut pages = self.ec2.describe_volumes().into_paginator().send();
        let mut attached = HashMap::new();
        let mut existing = HashSet::new();
        while let Some(page) = pages.next().await {
            for v in page.map_err(|e| format!("DescribeVolumes: {e}"))?.volumes() {
                let Some(id) = v.volume_id() else { continue };
                existing.insert(id.to_owned());
                let attachment = v.attachments().iter().find(|a| {
                    a.instance_id() == Some(self.config.instance_id.as_str())
                        && matches!(
                            a.state(),
                            Some(VolumeAttachmentState::Attached | VolumeAttachmentState::Attaching)
                        )
                });
                if let Some(a) = attachment {
                    attached.insert(
                        id.to_owned(),
                        Attached {
                            device_name: a.device().unwrap_or_default().to_owned(),
                            size_gib: v.size().unwrap_or_default(),
                            snapshot_id: v.snapshot_id().filter(|s| !s.is_empty()).map(str::to_owned),
                        },
                    );
                }
            }
        }
        Ok((attached, existing))
    }

    /// Makes sure the backing file, loop device and links of an attached
    /// volume exist and have its size.
    fn attach(&mut self, volume_id: &str, want: &Attached) -> SimResult<()> {
        let file = self.volume_file(volume_id);
        let bytes = u64::try_from(want.size_gib).unwrap_or_default() << 30;
        if !file.exists() {
            match &want.snapshot_id {
                Some(snapshot_id) => {
                    if !self.snapshot_file(snapshot_id).exists() {
                        return Err(format!("no contents captured for snapshot {snapshot_id}"));
                    }
                    tracing::info!(volume_id, snapshot_id, "restoring from snapshot");
                    run(
                        "cp",
                        &[
                            "--sparse=always",
                            &self.snapshot_file(snapshot_id).to_string_lossy(),
                            &file.to_string_lossy(),
                        ],
                    )?;
                }
                None => tracing::info!(volume_id, size_gib = want.size_gib, "new blank volume"),
            }
            std::fs::OpenOptions::new()
                .create(true)
                .truncate(false)
                .write(true)
                .open(&file)
                .map_err(|e| e.to_string())?;
        }
        let current = std::fs::metadata(&file).map_err(|e| e.to_string())?.len();
        if current < bytes {
            std::fs::OpenOptions::new()
                .write(true)
                .open(&file)
                .and_then(|f| f.set_len(bytes))
                .map_err(|e| e.to_string())?;
        }
        match self.local.get_mut(volume_id) {
            Some(local) if local.size_gib < want.size_gib => {
                tracing::info!(volume_id, size_gib = want.size_gib, "growing the device");
                run("losetup", &["-c", &local.loop_device.to_string_lossy()])?;
                local.size_gib = want.size_gib;
            }
            Some(_) => {}
            None => {
                let loop_device = PathBuf::from(run("losetup", &["--find", "--show", &file.to_string_lossy()])?.trim());
                let serial = volume_id.replacen('-', "", 1);
                let by_id = self
                    .config
                    .dev_dir
                    .join(format!("disk/by-id/nvme-Amazon_Elastic_Block_Store_{serial}"));
                let name = Path::new(&want.device_name)
                    .file_name()
                    .map(|n| self.config.dev_dir.join(n));
                let links: Vec<PathBuf> = [Some(by_id), name].into_iter().flatten().collect();
                for link in &links {
                    let _ = std::fs::remove_file(link);
                    std::os::unix::fs::symlink(&loop_device, link)
                        .map_err(|e| format!("linking {}: {e}", link.display()))?;
                }
                tracing::info!(volume_id, device = %loop_device.display(), name = %want.device_name, "attached");
                self.local.insert(
                    volume_id.to_owned(),
                    Local {
                        loop_device,
                        links,
                        size_gib: want.size_gib,
                    },
                );
            }
        }
        Ok(())
    }

    fn detach(&mut self, volume_id: &str) {
        if let Some(local) = self.local.remove(volume_id) {
            for link in &local.links {
                let _ = std::fs::remove_file(link);
            }
            let _ = run("losetup", &["-d", &local.loop_device.to_string_lossy()]);
            tracing::info!(volume_id, device = %local.loop_device.display(), "detached");
        }
    }

    /// Detaches every simulated device (on shutdown).
    pub fn detach_all(&mut self) {
        let ids: Vec<String> = self.local.keys().cloned().collect();
        for id in ids {
            self.detach(&id);
        }
    }

    /// Polls until `shutdown` completes, then detaches everything.
    pub async fn run(mut self, shutdown: impl Future<Output = ()>) {
        tokio::pin!(shutdown);
        loop {
            if let Err(e) = self.poll_once().await {
                tracing::warn!(error = %e, "poll failed");
            }
            tokio::select! {
                () = &mut shutdown => break,
                () = tokio::time::sleep(self.config.poll) => {}
            }
        }
        self.detach_all();
    }
}

fn run(program: &str, args: &[&str]) -> SimResult<String> {
    let out = Command::new(program)
        .args(args)
        .output()
        .map_err(|e| format!("{program}: {e}"))?;
    if !out.status.success() {
        return Err(format!(
            "{program} {args:?}: {}",
            String::from_utf8_lossy(&out.stderr).trim()
        ));
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

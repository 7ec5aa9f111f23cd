//! A volume holding data whose reads fail in a window past its first MiB:
//! the re-audit's construction for N1 (`shared/reviews/helper-reaudit.md`,
//! E1), without device-mapper or FUSE.
//!
//! The volume's backing file lies on an ext2 filesystem of 1 KiB blocks
//! (itself on a loop device). In such a file, bytes from 268 KiB on are
//! mapped through the double-indirect block, each of its entries covering
//! 256 KiB (ext2: 12 direct blocks, then 256 four-byte block numbers per
//! indirect block). The test rewrites one entry to a block past the end of
//! the outer filesystem, so every read of that 256 KiB window of the volume
//! fails with EIO, while the rest reads as before.
#![allow(clippy::expect_used, reason = "test support")]

use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};

use crate::run;
use crate::{LoopVolume, make_dir};

/// The outer filesystem's block size, in bytes.
const BLOCK: u64 = 1024;
/// Bytes of a file mapped before its double-indirect block: 12 direct
/// blocks and one indirect block of 256 entries.
const BEFORE_DIND: u64 = (12 + 256) * BLOCK;
/// Bytes each entry of the double-indirect block maps.
const PER_DIND_ENTRY: u64 = 256 * BLOCK;

/// A loop volume, blank or holding an ext4 filesystem with a marker file,
/// whose reads fail in [`UnreadableVolume::window`].
pub struct UnreadableVolume {
    /// The volume (its backing file named after the volume id).
    pub volume: LoopVolume,
    _outer_mount: OuterMount,
    _outer: LoopVolume,
    window: std::ops::Range<u64>,
}

/// Unmounts the outer filesystem (lazily: the volume's loop device lets go
/// of its file asynchronously) when dropped.
struct OuterMount(PathBuf);

impl Drop for OuterMount {
    fn drop(&mut self) {
        let _ = rustix::mount::unmount(self.0.as_path(), rustix::mount::UnmountFlags::DETACH);
    }
}

impl UnreadableVolume {
    /// The text of the marker file `/marker.txt` on the volume.
    pub const MARKER: &'static str = "precious data\n";
    /// The volume's filesystem UUID.
    pub const UUID: &'static str = "11111111-2222-3333-4444-555555555555";

    /// Builds it in `dir`: `size_mib` MiB, all zeros or (with
    /// `filesystem`) an ext4 (label `precious`, UUID [`Self::UUID`],
    /// `/marker.txt`), whose reads fail in the 256 KiB window of
    /// double-indirect entry `entry` (entry 6: bytes 1804 KiB to 2060 KiB,
    /// inside where libblkid's LUKS prober reads).
    pub fn create(dir: &Path, volume_id: &str, size_mib: u64, entry: u64, filesystem: bool) -> Self {
        let work = make_dir(&dir.join("unreadable"));
        let inner = work.join("inner.img");
        std::fs::File::create(&inner)
            .and_then(|f| f.set_len(size_mib << 20))
            .expect("inner image");
        let inner_text = inner.to_string_lossy();
        if filesystem {
            run(
                "mkfs.ext4",
                &["-q", "-F", "-L", "precious", "-U", Self::UUID, &inner_text],
            );
            let marker = work.join("marker.src");
            std::fs::write(&marker, Self::MARKER).expect("marker");
            let write = format!("write {} marker.txt", marker.display());
            run("debugfs", &["-w", "-R", &write, &inner_text]);
        }

        let outer_file = work.join("outer.img");
        std::fs::File::create(&outer_file)
            .and_then(|f| f.set_len((size_mib + 16) << 20))
            .expect("outer image");
        let outer_text = outer_file.to_string_lossy().into_owned();
        run("mkfs.ext2", &["-q", "-F", "-b", "1024", &outer_text]);
        let mount = make_dir(&work.join("outer"));
        let file_name = format!("{volume_id}.img");
        {
            // Copied with plain writes, zeros included, so every block of
            // the volume's file is allocated (no holes in the mapping).
            let outer = LoopVolume::attach_file("outer", &outer_file);
            run(
                "mount",
                &["-t", "ext2", &outer.device.to_string_lossy(), &mount.to_string_lossy()],
            );
            let _mounted = OuterMount(mount.clone());
            let copy = format!("of={}", mount.join(&file_name).display());
            run(
                "dd",
                &[&format!("if={inner_text}"), &copy, "bs=1M", "conv=fsync", "status=none"],
            );
        }
        let dind = double_indirect_block(&outer_text, &file_name);
        let at = dind * BLOCK + entry * 4;
        let image = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .open(&outer_file)
            .expect("open outer image");
        let mut old = [0u8; 4];
        image.read_exact_at(&mut old, at).expect("read entry");
        assert_ne!(u32::from_le_bytes(old), 0, "the entry maps nothing");
        image
            .write_all_at(&0x00ff_ffff_u32.to_le_bytes(), at)
            .expect("write entry");
        image.sync_all().expect("sync");
        drop(image);
        // A fresh loop device, so no cached block of the old mapping is
        // read again.
        let outer = LoopVolume::attach_file("outer", &outer_file);
        run(
            "mount",
            &[
                "-t",
                "ext2",
                "-o",
                "ro",
                &outer.device.to_string_lossy(),
                &mount.to_string_lossy(),
            ],
        );
        let outer_mount = OuterMount(mount.clone());
        let volume = LoopVolume::attach_file(volume_id, &mount.join(&file_name));
        let start = BEFORE_DIND + entry * PER_DIND_ENTRY;
        Self {
            volume,
            _outer_mount: outer_mount,
            _outer: outer,
            window: start..start + PER_DIND_ENTRY,
        }
    }

    /// The bytes of the volume whose reads fail.
    pub fn window(&self) -> std::ops::Range<u64> {
        self.window.clone()
    }

    /// The marker file's text, read with debugfs through the volume's
    /// device (its blocks lie in the first MiB).
    pub fn marker(&self) -> String {
        run(
            "debugfs",
            &["-R", "cat /marker.txt", &self.volume.device.to_string_lossy()],
        )
    }

    /// The filesystem UUID its superblock holds (`dumpe2fs -h`).
    pub fn uuid(&self) -> String {
        run("dumpe2fs", &["-h", &self.volume.device.to_string_lossy()])
            .lines()
            .find_map(|l| l.strip_prefix("Filesystem UUID:"))
            .map(|u| u.trim().to_owned())
            .unwrap_or_default()
    }
}

/// The double-indirect block of `file` in the ext2 image `image`, from
/// `debugfs stat` (`(DIND):1299`).
fn double_indirect_block(image: &str, file: &str) -> u64 {
    let stat = run("debugfs", &["-R", &format!("stat /{file}"), image]);
    stat.split_whitespace()
        .find_map(|word| word.strip_prefix("(DIND):"))
        .and_then(|n| n.trim_end_matches(',').parse().ok())
        .expect("the file has a double-indirect block")
}

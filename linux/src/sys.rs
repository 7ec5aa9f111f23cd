//! The crate's one `unsafe` block: the NVMe admin ioctl.
#![allow(unsafe_code)]

use std::io;
use std::os::fd::BorrowedFd;

use rustix::ioctl::{Opcode, Updater, ioctl, opcode};

/// `struct nvme_admin_cmd` (alias `nvme_passthru_cmd`) from the kernel's
/// `include/uapi/linux/nvme_ioctl.h`: 72 bytes, natural alignment.
#[repr(C)]
#[derive(Debug, Default)]
pub(crate) struct NvmeAdminCmd {
    pub opcode: u8,
    pub flags: u8,
    pub rsvd1: u16,
    pub nsid: u32,
    pub cdw2: u32,
    pub cdw3: u32,
    pub metadata: u64,
    pub addr: u64,
    pub metadata_len: u32,
    pub data_len: u32,
    pub cdw10: u32,
    pub cdw11: u32,
    pub cdw12: u32,
    pub cdw13: u32,
    pub cdw14: u32,
    pub cdw15: u32,
    pub timeout_ms: u32,
    pub result: u32,
}

/// `NVME_IOCTL_ADMIN_CMD = _IOWR('N', 0x41, struct nvme_admin_cmd)`, which
/// is 0xC0484E41 on Linux (nvme_ioctl.h).
pub(crate) const NVME_IOCTL_ADMIN_CMD: Opcode = opcode::read_write::<NvmeAdminCmd>(b'N', 0x41);

/// Sends `cmd` (whose `addr`/`data_len` must describe `buffer`) to the
/// controller behind `fd`: a `/dev/nvmeN` controller or a `/dev/nvmeNnM`
/// namespace.
pub(crate) fn nvme_admin_command(fd: BorrowedFd<'_>, cmd: &mut NvmeAdminCmd, buffer: &mut [u8]) -> io::Result<()> {
    cmd.addr = buffer.as_mut_ptr() as u64;
    cmd.data_len =
        u32::try_from(buffer.len()).map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, "buffer too large"))?;
    // SAFETY: NVME_IOCTL_ADMIN_CMD takes a `struct nvme_admin_cmd`, which
    // NvmeAdminCmd mirrors field for field (size asserted in a test). The
    // kernel writes at most `data_len` bytes to `addr`, which points at
    // `buffer`, exclusively borrowed and alive for the whole call.
    unsafe {
        let updater = Updater::<NVME_IOCTL_ADMIN_CMD, NvmeAdminCmd>::new(cmd);
        ioctl(fd, updater)?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn admin_command_matches_the_kernel_layout() {
        assert_eq!(std::mem::size_of::<NvmeAdminCmd>(), 72);
        assert_eq!(std::mem::offset_of!(NvmeAdminCmd, metadata), 16);
        assert_eq!(std::mem::offset_of!(NvmeAdminCmd, addr), 24);
        assert_eq!(std::mem::offset_of!(NvmeAdminCmd, data_len), 36);
        assert_eq!(std::mem::offset_of!(NvmeAdminCmd, cdw10), 40);
        assert_eq!(std::mem::offset_of!(NvmeAdminCmd, timeout_ms), 64);
        assert_eq!(std::mem::offset_of!(NvmeAdminCmd, result), 68);
        assert_eq!(NVME_IOCTL_ADMIN_CMD as u64, 0xC048_4E41);
    }
}

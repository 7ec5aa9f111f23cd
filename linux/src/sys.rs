//! The crate's only `unsafe` code: the NVMe admin ioctl.
#![allow(unsafe_code)]

use std::io;
use std::os::fd::BorrowedFd;

use rustix::ioctl::{Ioctl, IoctlOutput, Opcode, ioctl, opcode};

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

/// One `NVME_IOCTL_ADMIN_CMD` call on `cmd`, whose output is the ioctl's
/// return value: the command's NVMe status (0 when it succeeded).
struct AdminCommand<'a>(&'a mut NvmeAdminCmd);

// SAFETY: the opcode is NVME_IOCTL_ADMIN_CMD, whose argument is a pointer
// to `struct nvme_admin_cmd`, which NvmeAdminCmd mirrors field for field
// (size asserted in a test); the kernel reads and writes only that struct
// and the buffer its `addr`/`data_len` describe.
unsafe impl Ioctl for AdminCommand<'_> {
    type Output = u32;
    const IS_MUTATING: bool = true;

    fn opcode(&self) -> Opcode {
        NVME_IOCTL_ADMIN_CMD
    }

    fn as_ptr(&mut self) -> *mut std::ffi::c_void {
        std::ptr::from_mut(self.0).cast()
    }

    unsafe fn output_from_ptr(out: IoctlOutput, _: *mut std::ffi::c_void) -> rustix::io::Result<u32> {
        // A negative return is an errno, which rustix has already turned
        // into an error: what is left is the status field (NVMe Base
        // Specification, "Completion Queue Entry": SCT and SC).
        Ok(out.unsigned_abs())
    }
}

/// Sends `cmd` (whose `addr`/`data_len` are set to describe `buffer`) to
/// the controller behind `fd`: a `/dev/nvmeN` controller or a `/dev/nvmeNnM`
/// namespace. Returns the command's NVMe status: 0 on success, else the
/// status code type and code the controller completed it with (e.g.
/// 0x4002, Invalid Field in Command with Do Not Retry, for a log page it
/// does not have).
///
/// # Errors
/// The ioctl's own error (`EACCES`, `ENOTTY`, …).
pub(crate) fn nvme_admin_command(fd: BorrowedFd<'_>, cmd: &mut NvmeAdminCmd, buffer: &mut [u8]) -> io::Result<u32> {
    cmd.addr = buffer.as_mut_ptr() as u64;
    cmd.data_len =
        u32::try_from(buffer.len()).map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, "buffer too large"))?;
    // SAFETY: `addr` points at `buffer`, exclusively borrowed and alive
    // for the whole call, and the kernel writes at most `data_len` bytes.
    let status = unsafe { ioctl(fd, AdminCommand(cmd))? };
    Ok(status)
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

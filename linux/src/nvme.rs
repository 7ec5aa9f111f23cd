//! NVMe Identify Controller: the identity an EBS volume proves itself with;
//! and Get Log Page, for EBS's detailed performance statistics.
//!
//! Layout from the NVMe Base Specification, "Identify Controller data
//! structure": VID bytes 0–1 (little endian), SN bytes 4–23, MN bytes
//! 24–63 (ASCII, space padded), vendor specific area from byte 3072. EBS
//! puts the device name given to AttachVolume in the first 32 bytes of the
//! vendor specific area.

use std::io;
use std::os::fd::AsFd;

use crate::sys::{NvmeAdminCmd, nvme_admin_command};

/// Size of the Identify data structure, in bytes.
pub const IDENTIFY_LEN: usize = 4096;

/// The PCI vendor id of Amazon (Annapurna Labs) NVMe controllers.
pub const EBS_VENDOR_ID: u16 = 0x1d0f;

/// The model number EBS volumes report.
pub const EBS_MODEL: &str = "Amazon Elastic Block Store";

/// The fields of Identify Controller this project reads.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct IdentifyController {
    /// PCI vendor id.
    pub vendor_id: u16,
    /// Serial number, trailing padding removed (`vol…` on EBS).
    pub serial: String,
    /// Model number, trailing padding removed.
    pub model: String,
    /// EBS only: the device name given to AttachVolume (`sdf`, `xvdba`,
    /// `/dev/xvdba`), `None` when the area is empty.
    pub requested_device_name: Option<String>,
}

impl IdentifyController {
    /// Parses a 4096-byte Identify Controller buffer.
    pub fn parse(data: &[u8; IDENTIFY_LEN]) -> Self {
        let name = ascii_field(&data[3072..3104]);
        Self {
            vendor_id: u16::from_le_bytes([data[0], data[1]]),
            serial: ascii_field(&data[4..24]),
            model: ascii_field(&data[24..64]),
            requested_device_name: (!name.is_empty()).then_some(name),
        }
    }
}

/// An ASCII field with its space or NUL padding removed; bytes outside
/// printable ASCII become `?` so a hostile device cannot inject text.
fn ascii_field(bytes: &[u8]) -> String {
    bytes
        .iter()
        .map(|&b| {
            if b.is_ascii_graphic() || b == b' ' {
                b as char
            } else if b == 0 {
                ' '
            } else {
                '?'
            }
        })
        .collect::<String>()
        .trim()
        .to_owned()
}

/// Sends Identify Controller (admin opcode 0x06, CNS 1, nsid 0) through
/// `NVME_IOCTL_ADMIN_CMD` on an open controller or namespace device.
///
/// # Errors
/// The ioctl's error: `EACCES`/`EPERM` without CAP_SYS_ADMIN on kernels
/// before 6.2, `ENOTTY` when `fd` is not an NVMe device.
pub fn identify_controller(fd: impl AsFd) -> io::Result<IdentifyController> {
    const OPCODE_IDENTIFY: u8 = 0x06;
    const CNS_CONTROLLER: u32 = 1;
    let mut data = Box::new([0u8; IDENTIFY_LEN]);
    let mut cmd = NvmeAdminCmd {
        opcode: OPCODE_IDENTIFY,
        cdw10: CNS_CONTROLLER,
        ..NvmeAdminCmd::default()
    };
    match nvme_admin_command(fd.as_fd(), &mut cmd, data.as_mut_slice())? {
        0 => Ok(IdentifyController::parse(&data)),
        status => Err(io::Error::other(format!(
            "Identify Controller completed with NVMe status {status:#x}"
        ))),
    }
}

/// The log page id of EBS detailed performance statistics (vendor
/// specific; `AMZN_NVME_STATS_LOGPAGE_ID` in nvme-cli's amzn plugin).
pub const EBS_STATISTICS_LOG_PAGE: u8 = 0xD0;

/// Bytes read of a log page: EBS's statistics page as nvme-cli's amzn
/// plugin and the Go driver read it.
pub const LOG_PAGE_LEN: usize = 4096;

/// What Get Log Page gave.
#[derive(Debug, PartialEq, Eq)]
pub enum LogPage {
    /// The page's first [`LOG_PAGE_LEN`] bytes.
    Read(Box<[u8; LOG_PAGE_LEN]>),
    /// The controller completed the command with this non-zero NVMe
    /// status: it has no such page (QEMU's emulated controller answers
    /// 0x4002, Invalid Field in Command, Do Not Retry).
    Unavailable(u32),
}

/// Sends Get Log Page (admin opcode 0x02) for `log_id`, namespace 1, the
/// first [`LOG_PAGE_LEN`] bytes (NVMe Base Specification, "Get Log Page
/// command": CDW10 bits 31:16 are the 0's based number of dwords, bits
/// 7:0 the log page id) on an open controller or namespace device.
///
/// # Errors
/// The ioctl's error: `EACCES`/`EPERM` without CAP_SYS_ADMIN, `ENOTTY`
/// when `fd` is not an NVMe device.
pub fn get_log_page(fd: impl AsFd, log_id: u8) -> io::Result<LogPage> {
    const OPCODE_GET_LOG_PAGE: u8 = 0x02;
    // LOG_PAGE_LEN bytes are 1024 dwords: 1023, 0's based.
    const NUMDL: u32 = 1023;
    let mut data = Box::new([0u8; LOG_PAGE_LEN]);
    let mut cmd = NvmeAdminCmd {
        opcode: OPCODE_GET_LOG_PAGE,
        nsid: 1,
        cdw10: u32::from(log_id) | (NUMDL << 16),
        ..NvmeAdminCmd::default()
    };
    match nvme_admin_command(fd.as_fd(), &mut cmd, data.as_mut_slice())? {
        0 => Ok(LogPage::Read(data)),
        status => Ok(LogPage::Unavailable(status)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn identify(vid: u16, serial: &str, model: &str, vendor_area: &[u8]) -> Box<[u8; IDENTIFY_LEN]> {
        let mut data = Box::new([0u8; IDENTIFY_LEN]);
        data[0..2].copy_from_slice(&vid.to_le_bytes());
        data[4..24].fill(b' ');
        data[4..4 + serial.len()].copy_from_slice(serial.as_bytes());
        data[24..64].fill(b' ');
        data[24..24 + model.len()].copy_from_slice(model.as_bytes());
        data[3072..3072 + vendor_area.len()].copy_from_slice(vendor_area);
        data
    }

    #[test]
    fn parses_an_ebs_controller() {
        let data = identify(EBS_VENDOR_ID, "vol0123456789abcdef0", EBS_MODEL, b"xvdba");
        let id = IdentifyController::parse(&data);
        assert_eq!(
            id,
            IdentifyController {
                vendor_id: 0x1d0f,
                serial: "vol0123456789abcdef0".into(),
                model: "Amazon Elastic Block Store".into(),
                requested_device_name: Some("xvdba".into()),
            }
        );
    }

    #[test]
    fn parses_padded_fields_and_an_empty_vendor_area() {
        let data = identify(0x1b36, "vol0123abcd", "QEMU NVMe Ctrl", b"");
        let id = IdentifyController::parse(&data);
        assert_eq!(id.vendor_id, 0x1b36);
        assert_eq!(id.serial, "vol0123abcd");
        assert_eq!(id.model, "QEMU NVMe Ctrl");
        assert_eq!(id.requested_device_name, None);
    }

    #[test]
    fn neutralises_non_ascii_bytes() {
        let data = identify(EBS_VENDOR_ID, "vol\u{1}abc", EBS_MODEL, b"/dev/xvdf\n");
        let id = IdentifyController::parse(&data);
        assert_eq!(id.serial, "vol?abc");
        assert_eq!(id.requested_device_name.as_deref(), Some("/dev/xvdf?"));
    }
}

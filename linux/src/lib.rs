//! What the node side of ebs-csi reads from Linux: the NVMe Identify
//! Controller data an EBS volume proves itself with, mountinfo, and the
//! socket systemd passes to a socket-activated service.
//!
//! Both the unprivileged agent and the privileged helper use it; it holds
//! no privileged operation (Identify through `NVME_IOCTL_ADMIN_CMD` needs
//! whatever the kernel asks of the caller: `CAP_SYS_ADMIN` before Linux
//! 6.2, an fd open for reading since), so the agent links none of the
//! helper's code.

pub mod activation;
pub mod mountinfo;
pub mod nvme;
mod sys;

//! The privileged node helper of ebs-csi.
//!
//! It formats, mounts, bind-mounts, unmounts and grows filesystems on
//! devices it has proved to be the EBS volume named in the request, at
//! paths it has resolved itself beneath its allowed roots, for peers whose
//! uid it has checked. `docs/helper.md` lists every step in code order.
//!
//! NVMe Identify and mountinfo parsing come from `ebs-csi-linux`, which the
//! unprivileged agent uses too; nothing here is linked into the agent.

pub mod claim;
pub mod confine;
pub mod device;
pub mod error;
pub mod exec;
pub mod format;
pub mod grow;
pub mod handler;
pub mod harden;
pub mod kernel;
pub mod layout;
pub mod mount;
pub mod mounts;
pub mod options;
pub mod path;
pub mod record;
pub mod runner;
pub mod server;
pub mod stop;
mod sys;

pub use sys::{clear_environment, close_inherited_fds};

//! The formatting options in a volume's `volume_context`: the Go driver's
//! StorageClass parameters (`blockSize`, `inodeSize`, …), which the
//! controller validates and writes into the context of the volumes it
//! creates, and the agent reads back into the helper's [`FormatOptions`]
//! for a Stage request. The helper gets only the typed options.

use std::collections::HashMap;

use ebs_csi_helper_proto::FormatOptions;

/// The `volume_context` keys, lowercase as the Go driver's controller
/// writes them (its node and ours read them case-insensitively).
const KEYS: [&str; 7] = [
    "blocksize",
    "inodesize",
    "bytesperinode",
    "numberofinodes",
    "ext4bigalloc",
    "ext4clustersize",
    "ext4encryptionsupport",
];

/// Whether `key` names a formatting option (case-insensitive).
pub fn is_key(key: &str) -> bool {
    KEYS.contains(&key.to_ascii_lowercase().as_str())
}

/// Reads the options from a map (StorageClass parameters or a volume
/// context), matching keys case-insensitively and ignoring other keys.
///
/// # Errors
/// A message naming the key whose value is not a number (or `true`/`false`
/// for `ext4BigAlloc` and `ext4EncryptionSupport`).
pub fn from_map(map: &HashMap<String, String>) -> Result<FormatOptions, String> {
    let mut options = FormatOptions::default();
    for (key, value) in map {
        let number = || {
            value
                .parse::<u32>()
                .map_err(|_| format!("{key}={value:?} is not a number"))
        };
        match key.to_ascii_lowercase().as_str() {
            "blocksize" => options.block_size = Some(number()?),
            "inodesize" => options.inode_size = Some(number()?),
            "bytesperinode" => options.bytes_per_inode = Some(number()?),
            "numberofinodes" => options.number_of_inodes = Some(u64::from(number()?)),
            "ext4clustersize" => options.ext4_cluster_size = Some(number()?),
            "ext4bigalloc" => options.ext4_bigalloc = boolean(key, value)?,
            "ext4encryptionsupport" => options.ext4_encryption = boolean(key, value)?,
            _ => {}
        }
    }
    Ok(options)
}

/// The options as `volume_context` entries (only those that are set).
pub fn to_context(options: &FormatOptions) -> HashMap<String, String> {
    let values = [
        options.block_size.map(u64::from),
        options.inode_size.map(u64::from),
        options.bytes_per_inode.map(u64::from),
        options.number_of_inodes,
        options.ext4_bigalloc.then_some(1),
        options.ext4_cluster_size.map(u64::from),
        options.ext4_encryption.then_some(1),
    ];
    KEYS.iter()
        .zip(values)
        .filter_map(|(key, value)| {
            let text = if matches!(*key, "ext4bigalloc" | "ext4encryptionsupport") {
                "true".to_owned()
            } else {
                value?.to_string()
            };
            value.map(|_| ((*key).to_owned(), text))
        })
        .collect()
}

fn boolean(key: &str, value: &str) -> Result<bool, String> {
    value
        .parse::<bool>()
        .map_err(|_| format!("{key}={value:?} is not true or false"))
}

#[cfg(test)]
mod tests {
    use ebs_csi_helper_proto::FsType;

    use super::*;

    fn map(pairs: &[(&str, &str)]) -> HashMap<String, String> {
        pairs.iter().map(|(k, v)| ((*k).to_owned(), (*v).to_owned())).collect()
    }

    #[test]
    fn reads_keys_case_insensitively_and_round_trips_the_context() {
        let options = from_map(&map(&[
            ("blockSize", "4096"),
            ("INODESIZE", "512"),
            ("ext4BigAlloc", "true"),
            ("type", "gp3"),
        ]))
        .unwrap();
        assert_eq!(
            options,
            FormatOptions {
                block_size: Some(4096),
                inode_size: Some(512),
                ext4_bigalloc: true,
                ..Default::default()
            }
        );
        assert_eq!(from_map(&to_context(&options)).unwrap(), options);
        assert_eq!(to_context(&options).get("blocksize").map(String::as_str), Some("4096"));
        assert_eq!(
            from_map(&map(&[("blocksize", "4k")])).unwrap_err(),
            r#"blocksize="4k" is not a number"#
        );
        assert_eq!(
            from_map(&map(&[("ext4bigalloc", "yes")])).unwrap_err(),
            r#"ext4bigalloc="yes" is not true or false"#
        );
        assert!(is_key("numberOfInodes") && !is_key("type"));
    }

    #[test]
    fn every_option_round_trips_the_context() {
        let all = FormatOptions {
            block_size: Some(4096),
            inode_size: Some(256),
            bytes_per_inode: Some(16384),
            number_of_inodes: Some(100_000),
            ext4_bigalloc: true,
            ext4_cluster_size: Some(65536),
            ext4_encryption: true,
            // The node's --legacy-xfs, never in a volume's context.
            xfs_legacy: false,
        };
        all.validate(FsType::Ext4).unwrap();
        assert_eq!(to_context(&all).len(), KEYS.len());
        assert_eq!(from_map(&to_context(&all)).unwrap(), all);
    }
}

#![allow(clippy::unwrap_used, reason = "tests: a failed step fails the test")]

use std::path::Path;

use super::dmi::DmiError;
use super::*;

fn write_dmi(dir: &Path, vendor: &str, asset_tag: &str, product: &str) {
    for (name, value) in [
        ("sys_vendor", vendor),
        ("board_asset_tag", asset_tag),
        ("product_name", product),
    ] {
        std::fs::write(dir.join(name), format!("{value}\n")).unwrap();
    }
}

fn settings(sources: Vec<Source>, dmi_dir: &Path) -> Settings {
    Settings {
        sources,
        api: kubernetes::ApiSource::InCluster(dmi_dir.join("no-service-account")),
        dmi_dir: dmi_dir.to_owned(),
    }
}

#[test]
fn dmi_of_a_nitro_instance_gives_id_and_type_only() {
    let dir = tempfile::tempdir().unwrap();
    write_dmi(dir.path(), "Amazon EC2", "i-0af01c0123456789a", "t3.micro");
    let found = dmi::read(dir.path()).unwrap();
    assert_eq!(
        found,
        Found {
            instance_id: Some("i-0af01c0123456789a".into()),
            instance_type: Some("t3.micro".into()),
            ..Found::default()
        }
    );
}

#[test]
fn dmi_of_another_vendor_or_a_xen_instance_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    write_dmi(
        dir.path(),
        "QEMU",
        "i-0af01c0123456789a",
        "Standard PC (Q35 + ICH9, 2009)",
    );
    assert!(matches!(dmi::read(dir.path()), Err(DmiError::NotEc2(v)) if v == "QEMU"));
    // Xen instances have an empty asset tag.
    write_dmi(dir.path(), "Amazon EC2", "", "t2.micro");
    assert!(matches!(dmi::read(dir.path()), Err(DmiError::NoInstanceId(v)) if v.is_empty()));
    write_dmi(dir.path(), "Amazon EC2", "i-0AF01C0123456789A", "t3.micro");
    assert!(matches!(dmi::read(dir.path()), Err(DmiError::NoInstanceId(_))));
}

#[tokio::test]
async fn dmi_completes_with_the_zone_flag_and_fails_without_it() {
    let dir = tempfile::tempdir().unwrap();
    write_dmi(dir.path(), "Amazon EC2", "i-0af01c0123456789a", "m5.large");
    let zone = Found {
        availability_zone: Some("eu-west-1c".into()),
        ..Found::default()
    };
    let metadata = resolve(zone, &settings(vec![Source::Dmi], dir.path())).await.unwrap();
    assert_eq!(
        metadata,
        NodeMetadata {
            instance_id: "i-0af01c0123456789a".into(),
            availability_zone: "eu-west-1c".into(),
            availability_zone_id: None,
            outpost_arn: None,
            instance_type: "m5.large".into(),
            network_interfaces: None,
            interfaces_from_imds: false,
            boot_volumes: 0,
        }
    );
    let error = resolve(Found::default(), &settings(vec![Source::Dmi], dir.path()))
        .await
        .unwrap_err();
    assert_eq!(
        error.to_string(),
        "no metadata source knows this node: dmi: it does not know the availability zone"
    );
}

#[tokio::test]
async fn flags_win_over_a_source_and_every_failure_is_named() {
    let dir = tempfile::tempdir().unwrap();
    write_dmi(dir.path(), "Amazon EC2", "i-0af01c0123456789a", "m5.large");
    let flags = Found {
        availability_zone: Some("eu-west-1c".into()),
        instance_type: Some("c5.xlarge".into()),
        ..Found::default()
    };
    let metadata = resolve(flags, &settings(vec![Source::Kubernetes, Source::Dmi], dir.path()))
        .await
        .unwrap();
    assert_eq!(metadata.instance_type, "c5.xlarge");
    assert_eq!(metadata.instance_id, "i-0af01c0123456789a");
    let empty = tempfile::tempdir().unwrap();
    let error = resolve(Found::default(), &settings(vec![Source::Dmi], empty.path()))
        .await
        .unwrap_err();
    assert_eq!(
        error.to_string(),
        format!(
            "no metadata source knows this node: dmi: reading {}: No such file or directory (os error 2)",
            empty.path().join("sys_vendor").display()
        )
    );
}

#[test]
fn sources_parse_by_name() {
    assert_eq!(Source::parse("kubernetes"), Ok(Source::Kubernetes));
    assert_eq!(Source::parse("metadata-labeler"), Ok(Source::MetadataLabeler));
    assert_eq!(
        Source::parse("ec2"),
        Err("unknown metadata source \"ec2\": imds, kubernetes, dmi or metadata-labeler".into())
    );
}

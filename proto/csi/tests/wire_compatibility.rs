//! `proto/csi/csi.proto` must be wire-compatible with the upstream CSI
//! definition: same package, services, methods, messages, fields (name,
//! number, type, label, oneof), enums and extensions.
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    reason = "integration tests: a failed step fails the test"
)]

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use prost_types::{DescriptorProto, EnumDescriptorProto, FileDescriptorProto};

fn compile(path: &Path) -> FileDescriptorProto {
    let dir = path.parent().unwrap();
    let name = path.file_name().unwrap();
    let set = protox::compile([name], [dir]).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    set.file
        .into_iter()
        .find(|f| f.name() == name.to_str().unwrap())
        .unwrap()
}

/// Every message, nested ones included, by full name.
fn messages(prefix: &str, list: &[DescriptorProto], out: &mut BTreeMap<String, DescriptorProto>) {
    for message in list {
        let name = format!("{prefix}.{}", message.name());
        messages(&name, &message.nested_type, out);
        out.insert(name, message.clone());
    }
}

fn enums(
    prefix: &str,
    messages_list: &[DescriptorProto],
    list: &[EnumDescriptorProto],
    out: &mut BTreeMap<String, Vec<(String, i32)>>,
) {
    for e in list {
        out.insert(
            format!("{prefix}.{}", e.name()),
            e.value.iter().map(|v| (v.name().to_owned(), v.number())).collect(),
        );
    }
    for message in messages_list {
        enums(
            &format!("{prefix}.{}", message.name()),
            &message.nested_type,
            &message.enum_type,
            out,
        );
    }
}

#[test]
#[cfg_attr(
    no_reference,
    ignore = "the upstream csi.proto is not beside the repository (../shared/reference)"
)]
fn matches_the_upstream_definition_field_by_field() {
    let reference = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../../shared/reference/csi.proto");
    let ours = compile(&PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("csi.proto"));
    let theirs = compile(&reference);
    assert_eq!(ours.package, theirs.package);
    assert_eq!(ours.dependency, theirs.dependency);
    assert_eq!(ours.extension, theirs.extension, "custom options (csi_secret, alpha_*)");
    assert_eq!(ours.service, theirs.service, "services and methods");

    let (mut our_messages, mut their_messages) = (BTreeMap::new(), BTreeMap::new());
    messages("", &ours.message_type, &mut our_messages);
    messages("", &theirs.message_type, &mut their_messages);
    assert_eq!(
        our_messages.keys().collect::<Vec<_>>(),
        their_messages.keys().collect::<Vec<_>>(),
        "message names"
    );
    for (name, theirs) in &their_messages {
        let ours = &our_messages[name];
        assert_eq!(ours.field.len(), theirs.field.len(), "{name}: field count");
        for (a, b) in ours.field.iter().zip(&theirs.field) {
            assert_eq!(a, b, "{name}.{}", b.name());
        }
        assert_eq!(ours.oneof_decl, theirs.oneof_decl, "{name}: oneofs");
        assert_eq!(ours.options, theirs.options, "{name}: options");
        assert_eq!(ours.reserved_range, theirs.reserved_range, "{name}: reserved");
    }
    assert!(
        their_messages.len() > 70,
        "the reference parsed to {} messages",
        their_messages.len()
    );

    let (mut our_enums, mut their_enums) = (BTreeMap::new(), BTreeMap::new());
    enums("", &ours.message_type, &ours.enum_type, &mut our_enums);
    enums("", &theirs.message_type, &theirs.enum_type, &mut their_enums);
    assert_eq!(our_enums, their_enums, "enums and their values");
}

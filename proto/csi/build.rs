//! Compiles `csi.proto` and `modify.proto` (the volume-modifier-for-k8s
//! sidecar's service) with protox (a pure-Rust protobuf compiler), so no
//! system `protoc` is needed on a fresh machine; sets `cfg(no_reference)`
//! when the upstream definition (`../shared/reference/csi.proto` beside the
//! repository) is not there, so the test comparing with it is reported as
//! ignored rather than passing without having compared.

fn main() -> Result<(), Box<dyn std::error::Error>> {
    println!("cargo:rerun-if-changed=csi.proto");
    println!("cargo:rerun-if-changed=modify.proto");
    println!("cargo::rustc-check-cfg=cfg(no_reference)");
    if !std::path::Path::new("../../../shared/reference/csi.proto").exists() {
        println!("cargo::rustc-cfg=no_reference");
    }
    let descriptors = protox::compile(["csi.proto", "modify.proto"], ["."])?;
    tonic_prost_build::configure()
        .build_client(true)
        .build_server(true)
        .compile_fds(descriptors)?;
    Ok(())
}

//! Compiles `csi.proto` with protox (a pure-Rust protobuf compiler), so no
//! system `protoc` is needed on a fresh machine.

fn main() -> Result<(), Box<dyn std::error::Error>> {
    println!("cargo:rerun-if-changed=csi.proto");
    let descriptors = protox::compile(["csi.proto"], ["."])?;
    tonic_prost_build::configure()
        .build_client(true)
        .build_server(true)
        .compile_fds(descriptors)?;
    Ok(())
}

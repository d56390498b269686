//! Generates the KServe v2 gRPC messages and the tonic service/client from
//! `proto/grpc_service.proto` without a `protoc` binary: `protox` (a
//! protobuf compiler written in Rust) parses the file into a
//! `FileDescriptorSet`, which `tonic-prost-build` turns into Rust.

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let proto = "proto/grpc_service.proto";
    println!("cargo:rerun-if-changed={proto}");
    let fds = protox::compile([proto], ["proto"])?;
    tonic_prost_build::configure()
        // Tensor payloads as `bytes::Bytes`: cloning a prepared request (or
        // handing an input to the response) shares the buffer, no copy.
        .bytes(".inference.ModelInferRequest.raw_input_contents")
        .bytes(".inference.ModelInferResponse.raw_output_contents")
        // Services that implement only some RPCs (the bench peer) answer
        // the others UNIMPLEMENTED.
        .generate_default_stubs(true)
        .compile_fds(fds)?;
    Ok(())
}

//! Generates the KServe v2 gRPC messages, Triton's model configuration and
//! the tonic service/client from `proto/` without a `protoc` binary:
//! `protox` (a protobuf compiler written in Rust) parses the files into a
//! `FileDescriptorSet`, which `tonic-prost-build` turns into Rust. The
//! encoded descriptor set is also written to `OUT_DIR` so the model
//! repository can parse `config.pbtxt` (protobuf text format) with
//! `prost-reflect` against the same messages.

use prost::Message;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let protos = ["proto/grpc_service.proto", "proto/model_config.proto"];
    for p in protos {
        println!("cargo:rerun-if-changed={p}");
    }
    let fds = protox::compile(protos, ["proto"])?;
    let out = std::path::PathBuf::from(std::env::var("OUT_DIR")?);
    std::fs::write(out.join("inference_descriptor.bin"), fds.encode_to_vec())?;
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

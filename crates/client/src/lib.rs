//! The tensorwire client library: connect by URI, look up models, infer (blocking and pipelined).

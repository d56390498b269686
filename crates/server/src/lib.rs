//! The tensorwire agent: model registry, sessions, per-model queues, timelines, listeners, shutdown.

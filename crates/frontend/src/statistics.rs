//! Triton's statistics extension over both front doors: gRPC
//! `ModelStatistics` and HTTP `GET v2/models[/NAME[/versions/V]]/stats`,
//! read from each model's [`server::ModelStats`] (recorded by the agent's
//! core for every transport, native ones included).
//!
//! Also [`Refusal`]: a front-door request refused by the front door's own
//! checks after its model was found counts as a failure of that model, as
//! it would in the core.

use crate::proto::{InferStatistics, ModelStatistics, ModelStatisticsResponse, StatisticDuration};
use crate::service::find_model;
use serde_json::{json, Value};
use server::dispatch::AgentCore;
use server::stats::CountNs;
use server::tenants::Seat;
use server::{ModelEntry, ModelStats, Via};
use tonic::Status;

/// The statistics of model `name` at `version` ("" or the served one), or
/// of every model when `name` is empty; NOT_FOUND for an unknown model or
/// version. With a `seat` (the agent has tenants): only the models its
/// tenant may use, and PERMISSION_DENIED for a model it may not.
pub(crate) fn model_statistics(
    core: &AgentCore,
    seat: Option<&Seat>,
    name: &str,
    version: &str,
) -> Result<ModelStatisticsResponse, Status> {
    let model_stats = if name.is_empty() {
        core.registry
            .models()
            .iter()
            .filter(|m| crate::access::may_see(seat, &m.signature().name))
            .map(|m| statistics_of(m))
            .collect()
    } else {
        vec![statistics_of(
            find_model(core, seat, name, version)?.as_ref(),
        )]
    };
    Ok(ModelStatisticsResponse { model_stats })
}

fn duration(d: CountNs) -> Option<StatisticDuration> {
    Some(StatisticDuration {
        count: d.count,
        ns: d.ns,
    })
}

/// One model's statistics as KServe/Triton reports them.
fn statistics_of(m: &ModelEntry) -> ModelStatistics {
    let s = m.stats.snapshot();
    ModelStatistics {
        name: m.signature().name.clone(),
        version: m.version.to_string(),
        last_inference: s.last_inference_ms,
        inference_count: s.inference_count,
        execution_count: s.execution_count,
        inference_stats: Some(InferStatistics {
            success: duration(s.success),
            fail: duration(s.fail),
            queue: duration(s.queue),
            compute_input: duration(s.compute_input),
            compute_infer: duration(s.compute_infer),
            compute_output: duration(s.compute_output),
            // No response cache.
            cache_hit: duration(CountNs::default()),
            cache_miss: duration(CountNs::default()),
        }),
        // No batching yet: no per-batch-size executions to report.
        batch_stats: Vec::new(),
    }
}

/// The HTTP/REST JSON form of a statistics response (Triton's field names;
/// every duration as `{"count": N, "ns": N}`).
pub(crate) fn stats_json(r: &ModelStatisticsResponse) -> Value {
    let d = |d: &Option<StatisticDuration>| {
        let d = d.unwrap_or_default();
        json!({ "count": d.count, "ns": d.ns })
    };
    let models: Vec<Value> = r
        .model_stats
        .iter()
        .map(|m| {
            let i = m.inference_stats.unwrap_or_default();
            json!({
                "name": m.name,
                "version": m.version,
                "last_inference": m.last_inference,
                "inference_count": m.inference_count,
                "execution_count": m.execution_count,
                "inference_stats": {
                    "success": d(&i.success),
                    "fail": d(&i.fail),
                    "queue": d(&i.queue),
                    "compute_input": d(&i.compute_input),
                    "compute_infer": d(&i.compute_infer),
                    "compute_output": d(&i.compute_output),
                    "cache_hit": d(&i.cache_hit),
                    "cache_miss": d(&i.cache_miss),
                },
                "batch_stats": [],
            })
        })
        .collect();
    json!({ "model_stats": models })
}

/// Counts a front-door request as a failure of its model if dropped before
/// [`passed`](Refusal::passed): between finding the model and handing the
/// request to the core (which counts from there on), every early return is
/// a refusal.
pub(crate) struct Refusal<'a> {
    stats: &'a ModelStats,
    via: Via,
    /// The request's `received` stamp (0 when not timed).
    arrived: u64,
    armed: bool,
}

impl<'a> Refusal<'a> {
    /// Armed for a request for `stats`' model that came `via` a front door
    /// and arrived at `arrived` (its `received` stamp, 0 when not timed).
    pub(crate) fn new(stats: &'a ModelStats, via: Via, arrived: u64) -> Refusal<'a> {
        Refusal {
            stats,
            via,
            arrived,
            armed: true,
        }
    }

    /// The request reached the core: nothing to count here.
    pub(crate) fn passed(mut self) {
        self.armed = false;
    }
}

impl Drop for Refusal<'_> {
    fn drop(&mut self) {
        if self.armed {
            self.stats.record_refused(self.via, self.arrived);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use server::ModelRegistry;
    use wire::{Limits, Timeline};

    #[test]
    fn every_model_or_one_and_not_found() {
        let core = AgentCore::new(ModelRegistry::with_identity(), Limits::default(), 1 << 20);
        let m = core.registry.find("identity").expect("identity");
        m.stats.arrived(Via::Grpc);
        m.stats
            .record_success(&Timeline::from_stamps([100, 100, 150, 150, 350, 400]), true);
        let all = model_statistics(&core, None, "", "").expect("all");
        assert_eq!(all.model_stats.len(), 1);
        let one = model_statistics(&core, None, "identity", "1").expect("one");
        let s = &one.model_stats[0];
        assert_eq!((s.name.as_str(), s.version.as_str()), ("identity", "1"));
        assert_eq!((s.inference_count, s.execution_count), (1, 1));
        let i = s.inference_stats.expect("stats");
        assert_eq!(i.success.map(|d| (d.count, d.ns)), Some((1, 300)));
        assert_eq!(i.compute_infer.map(|d| (d.count, d.ns)), Some((1, 200)));
        assert_eq!(
            model_statistics(&core, None, "nope", "")
                .expect_err("unknown")
                .code(),
            tonic::Code::NotFound
        );
        assert_eq!(
            model_statistics(&core, None, "identity", "2")
                .expect_err("unknown version")
                .code(),
            tonic::Code::NotFound
        );
        let j = stats_json(&one);
        assert_eq!(j["model_stats"][0]["inference_stats"]["success"]["ns"], 300);
        assert_eq!(j["model_stats"][0]["inference_stats"]["queue"]["count"], 1);
        assert_eq!(j["model_stats"][0]["batch_stats"], json!([]));
    }

    #[test]
    fn a_refusal_counts_unless_passed() {
        let stats = ModelStats::default();
        drop(Refusal::new(&stats, Via::Http, 0));
        Refusal::new(&stats, Via::Http, 0).passed();
        let v = stats.snapshot();
        assert_eq!(v.fail.count, 1);
        assert_eq!(v.by_via[Via::Http as usize], 1);
    }
}

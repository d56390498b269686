//! The model repository and model configuration calls, once for both
//! doors: repository index, model load and unload, and a model's
//! configuration, as functions over the [`FrontDoor`] that answer a tonic
//! [`Status`] on error. `service` (gRPC) and `http` (REST) only translate
//! their messages to and from these.
//!
//! Loading runs ONNX Runtime's session creation, which takes from
//! milliseconds to seconds: callers run these on a blocking-pool thread.

use crate::door::FrontDoor;
use crate::proto::model_repository_parameter::ParameterChoice;
use crate::proto::repository_index_response::ModelIndex;
use crate::proto::{ModelConfig, ModelRepositoryParameter};
use crate::repository::{Repository, RepositoryError};
use crate::service::find_model;
use server::tenants::Seat;
use std::collections::HashMap;
use tonic::Status;

/// The gRPC status of a repository error (the HTTP door maps statuses to
/// HTTP codes).
pub(crate) fn status_of(e: &RepositoryError) -> Status {
    match e {
        RepositoryError::NotFound { .. } => Status::not_found(e.to_string()),
        RepositoryError::Refused(_) => Status::failed_precondition(e.to_string()),
        RepositoryError::Load { .. } => Status::invalid_argument(e.to_string()),
        RepositoryError::Io { .. } => Status::internal(e.to_string()),
    }
}

fn repository(door: &FrontDoor) -> Result<&Repository, Status> {
    door.repository.as_deref().ok_or_else(|| {
        Status::failed_precondition(
            "the agent serves no model repository (start it with --model-repository DIR)",
        )
    })
}

/// The repository's models (only the ready ones with `ready_only`; only
/// those the caller's tenant may use, when it has a seat).
pub(crate) fn index(
    door: &FrontDoor,
    seat: Option<&Seat>,
    ready_only: bool,
) -> Result<Vec<ModelIndex>, Status> {
    let entries = repository(door)?.index().map_err(|e| status_of(&e))?;
    Ok(entries
        .into_iter()
        .filter(|e| crate::access::may_see(seat, &e.name))
        .filter(|e| !ready_only || e.state == Some(crate::repository::ModelState::Ready))
        .map(|e| ModelIndex {
            name: e.name,
            version: e.version.map(|v| v.to_string()).unwrap_or_default(),
            state: e.state.map(|s| s.as_str().to_string()).unwrap_or_default(),
            reason: e.reason,
        })
        .collect())
}

/// Loads or reloads `name`. Load parameters (Triton's `config` override
/// and model files sent with the request) are refused: the repository
/// directory is the one source of models.
pub(crate) fn load(
    door: &FrontDoor,
    name: &str,
    parameters: &HashMap<String, ModelRepositoryParameter>,
) -> Result<(), Status> {
    refuse_parameters("load", parameters.keys().map(String::as_str))?;
    repository(door)?.load(name).map_err(|e| status_of(&e))
}

/// Unloads `name` (`unload_dependents` is accepted: there are no
/// ensembles, so nothing depends on a model).
pub(crate) fn unload(
    door: &FrontDoor,
    name: &str,
    parameters: &HashMap<String, ModelRepositoryParameter>,
) -> Result<(), Status> {
    let others = parameters.iter().filter(|(k, v)| {
        !(k.as_str() == "unload_dependents"
            && matches!(v.parameter_choice, Some(ParameterChoice::BoolParam(_))))
    });
    refuse_parameters("unload", others.map(|(k, _)| k.as_str()))?;
    repository(door)?.unload(name).map_err(|e| status_of(&e))
}

/// Refuses any parameter named by `keys`.
pub(crate) fn refuse_parameters<'a>(
    what: &str,
    mut keys: impl Iterator<Item = &'a str>,
) -> Result<(), Status> {
    match keys.next() {
        None => Ok(()),
        Some(k) => Err(Status::invalid_argument(format!(
            "{what} parameter '{k}' is not supported (tensorwire loads models only from the \
             repository directory: put the model and its config.pbtxt there)"
        ))),
    }
}

/// The configuration of `name` at `version` (PERMISSION_DENIED when the
/// caller's tenant may not use it).
pub(crate) fn config(
    door: &FrontDoor,
    seat: Option<&Seat>,
    name: &str,
    version: &str,
) -> Result<ModelConfig, Status> {
    let model = find_model(&door.core, seat, name, version)?;
    Ok(door.model_config(&model))
}

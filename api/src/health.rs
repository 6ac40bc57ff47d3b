//! `/healthz` (the process answers) and `/readyz` (it can do its job).

use axum::Json;
use axum::extract::State;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use sea_orm::DatabaseConnection;
use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

use crate::AppState;
use crate::error::{ErrorBody, error_response};

/// Liveness answer.
#[derive(Debug, Serialize, Deserialize, ToSchema)]
pub struct Health {
    /// Always `ok`.
    pub status: String,
}

/// The process is up.
#[utoipa::path(get, path = "/healthz", tag = "health", responses((status = 200, body = Health)))]
pub async fn healthz() -> Json<Health> {
    Json(Health {
        status: "ok".into(),
    })
}

/// The database the pages are read from and NATS are reachable, the
/// migrations are applied, and the other roles of this process (a
/// consumer in `seawall run`) can do their work; 503 naming each failing
/// part otherwise.
///
/// With a read replica (`admin_database_url`) either database will do: the
/// API shows what is stuck from the replica while the primary is down or
/// failing over (its repairs then answer 503), and repairs on the primary
/// while the replica is down (its pages then answer 503).
#[utoipa::path(get, path = "/readyz", tag = "health",
    responses((status = 200, body = Health), (status = 503, body = ErrorBody)))]
pub async fn readyz(State(state): State<AppState>) -> Response {
    let mut problems = match &state.reads {
        None => problems_of_database(&state.db).await,
        // Both at once: a primary that hangs must not keep the replica's
        // answer waiting past the probe's timeout.
        Some(reads) => {
            let (primary, replica) =
                tokio::join!(problems_of_database(&state.db), problems_of_database(reads));
            if primary.is_empty() || replica.is_empty() {
                Vec::new()
            } else {
                primary
                    .into_iter()
                    .chain(replica.into_iter().map(|p| format!("replica: {p}")))
                    .collect()
            }
        }
    };
    problems.extend(problem_of_broker(state.nats.as_ref()));
    problems.extend(state.checks.iter().filter_map(|check| check()));
    answer(problems)
}

/// What keeps a process from being ready: the database unreachable or
/// behind on migrations, the broker (when the process uses one)
/// disconnected.
pub(crate) async fn problems(
    db: &DatabaseConnection,
    nats: Option<&async_nats::Client>,
) -> Vec<String> {
    let mut problems = problems_of_database(db).await;
    problems.extend(problem_of_broker(nats));
    problems
}

/// The broker (when the process uses one) disconnected.
fn problem_of_broker(nats: Option<&async_nats::Client>) -> Option<String> {
    nats.filter(|client| client.connection_state() != async_nats::connection::State::Connected)
        .map(|_| "NATS not connected".to_owned())
}

/// How long the database checks of one `/readyz` may take: a database
/// that hangs is not ready, and the answer must come within a probe's
/// timeout (Kubernetes' default is 1 s; the manifests give 3 s).
const DATABASE_CHECK_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(2);

/// The database unreachable (or not answering within
/// [`DATABASE_CHECK_TIMEOUT`]), or behind on migrations.
async fn problems_of_database(db: &DatabaseConnection) -> Vec<String> {
    tokio::time::timeout(DATABASE_CHECK_TIMEOUT, checks_of_database(db))
        .await
        .unwrap_or_else(|_| {
            vec![format!(
                "database did not answer within {DATABASE_CHECK_TIMEOUT:?}"
            )]
        })
}

async fn checks_of_database(db: &DatabaseConnection) -> Vec<String> {
    let mut problems = Vec::new();
    if let Err(err) = db.ping().await {
        tracing::warn!(error = %err, "readiness: database unreachable");
        problems.push("database unreachable".to_owned());
    } else {
        // Migrations a newer release applied are expected (a rolling
        // upgrade, a rollback); only this release's missing ones are not.
        let status = migration::status(db).await;
        if let Ok(status) = &status {
            // Kept current while the process runs: during a rolling
            // upgrade the newer release migrates after this one started.
            metrics::gauge!("seawall_schema_unknown_migrations").set(status.unknown.len() as f64);
        }
        match status {
            Ok(status) if status.pending.is_empty() => {}
            Ok(status) => {
                problems.push(format!("{} migration(s) not applied", status.pending.len()))
            }
            Err(err) => {
                tracing::warn!(error = %err, "readiness: cannot read migrations");
                problems.push("migrations not readable".to_owned());
            }
        }
    }
    problems
}

/// 200 `ok` without problems, 503 `not_ready` naming them.
pub(crate) fn answer(problems: Vec<String>) -> Response {
    if problems.is_empty() {
        Json(Health {
            status: "ok".into(),
        })
        .into_response()
    } else {
        error_response(
            StatusCode::SERVICE_UNAVAILABLE,
            "not_ready",
            problems.join("; "),
        )
    }
}

//! HTTP integration for axum (feature `axum`).

use std::cell::RefCell;

use crate::record::StoredResponse;

tokio::task_local! {
    /// Set by the replay layer around a request; a replay leaves its stored response here.
    static REPLAYED: RefCell<Option<StoredResponse>>;
}

pub(crate) fn note_replay(stored: &StoredResponse) {
    let _ = REPLAYED.try_with(|slot| *slot.borrow_mut() = Some(stored.clone()));
}

mod replay_impls {
    use axum::Json;
    use http::StatusCode;
    use serde::Serialize;
    use serde::de::DeserializeOwned;

    use crate::error::Error;
    use crate::record::StoredResponse;
    use crate::replay::{Replay, marker};

    fn body<T: Serialize>(value: &T, status: StatusCode) -> Result<StoredResponse, Error> {
        Ok(StoredResponse {
            status: Some(status.as_u16()),
            is_error: false,
            body: serde_json::to_vec(value).map_err(|e| Error::Encode(e.to_string()))?,
        })
    }

    fn value<T: DeserializeOwned>(stored: &StoredResponse) -> Result<T, Error> {
        serde_json::from_slice(&stored.body).map_err(|e| Error::Decode(e.to_string()))
    }

    /// Stored as the JSON body with status 200.
    impl<T: Serialize + DeserializeOwned> Replay<marker::Http> for Json<T> {
        fn encode(&self) -> Result<StoredResponse, Error> {
            body(&self.0, StatusCode::OK)
        }
        fn decode(stored: StoredResponse) -> Result<Self, Error> {
            value(&stored).map(Json)
        }
    }

    /// Stored as the status and the JSON body.
    impl<T: Serialize + DeserializeOwned> Replay<marker::Http> for (StatusCode, Json<T>) {
        fn encode(&self) -> Result<StoredResponse, Error> {
            body(&self.1.0, self.0)
        }
        fn decode(stored: StoredResponse) -> Result<Self, Error> {
            let status = stored
                .status
                .and_then(|s| StatusCode::from_u16(s).ok())
                .unwrap_or(StatusCode::OK);
            Ok((status, Json(value(&stored)?)))
        }
    }
}

//! A scripted stand-in for the API server, for unit tests of request shapes: which requests a
//! piece of code makes, in what order, and what it does with an answer. It is never evidence of
//! behaviour (that is the e2e suite's, against a real kube-apiserver and etcd).
//!
//! Every request is recorded (method, path, body); each answer comes from the test's script, a
//! function of the request. With a gate, a request is answered only once the test adds a permit.

use std::sync::atomic::{AtomicUsize, Ordering::SeqCst};
use std::sync::{Arc, Mutex};

use kube::Client;
use tokio::sync::Semaphore;

/// A request as the stand-in received it.
#[derive(Clone, Debug)]
pub struct Request {
    pub method: String,
    pub path: String,
    pub body: String,
}

/// The stand-in's answer: a status code and a JSON body.
pub struct Answer {
    pub status: u16,
    pub body: String,
}

impl Answer {
    /// `200` with `body`.
    pub fn ok(body: serde_json::Value) -> Answer {
        Answer {
            status: 200,
            body: body.to_string(),
        }
    }

    /// `status` with the request's own body: an object as created or written.
    pub fn echo(request: &Request, status: u16) -> Answer {
        Answer {
            status,
            body: request.body.clone(),
        }
    }

    /// A `Status` object: success for `200`, else a failure with `reason` and `message`.
    pub fn status(code: u16, reason: &str, message: &str) -> Answer {
        let body = if code == 200 {
            serde_json::json!({"apiVersion": "v1", "kind": "Status", "status": "Success"})
        } else {
            serde_json::json!({
                "apiVersion": "v1", "kind": "Status", "status": "Failure",
                "code": code, "reason": reason, "message": message,
            })
        };
        Answer {
            status: code,
            body: body.to_string(),
        }
    }
}

type Script = dyn Fn(&Request) -> Answer + Send + Sync;

/// What the stand-in saw and is doing.
#[derive(Clone, Default)]
pub struct FakeApi {
    requests: Arc<Mutex<Vec<Request>>>,
    in_flight: Arc<AtomicUsize>,
    peak: Arc<AtomicUsize>,
    answered: Arc<AtomicUsize>,
}

impl FakeApi {
    /// A client whose requests `script` answers at once.
    pub fn new(script: impl Fn(&Request) -> Answer + Send + Sync + 'static) -> (Client, FakeApi) {
        FakeApi::serve(Arc::new(script), None)
    }

    /// A client whose requests `script` answers, each once `gate` gives it a permit.
    pub fn gated(
        script: impl Fn(&Request) -> Answer + Send + Sync + 'static,
        gate: Arc<Semaphore>,
    ) -> (Client, FakeApi) {
        FakeApi::serve(Arc::new(script), Some(gate))
    }

    fn serve(script: Arc<Script>, gate: Option<Arc<Semaphore>>) -> (Client, FakeApi) {
        let fake = FakeApi::default();
        let state = fake.clone();
        let service = tower::service_fn(move |req: http::Request<kube::client::Body>| {
            let (state, script, gate) = (state.clone(), script.clone(), gate.clone());
            async move {
                let now = state.in_flight.fetch_add(1, SeqCst) + 1;
                state.peak.fetch_max(now, SeqCst);
                let (parts, body) = req.into_parts();
                let bytes = http_body_util::BodyExt::collect(body).await?.to_bytes();
                let request = Request {
                    method: parts.method.to_string(),
                    path: parts.uri.path().to_string(),
                    body: String::from_utf8_lossy(&bytes).into_owned(),
                };
                state.requests.lock().unwrap().push(request.clone());
                if let Some(gate) = gate {
                    gate.acquire().await?.forget();
                }
                let answer = script(&request);
                state.in_flight.fetch_sub(1, SeqCst);
                state.answered.fetch_add(1, SeqCst);
                Ok::<_, tower::BoxError>(
                    http::Response::builder()
                        .status(answer.status)
                        .header("content-type", "application/json")
                        .body(kube::client::Body::from(answer.body.into_bytes()))
                        .unwrap(),
                )
            }
        });
        (Client::new(service, "ns"), fake)
    }

    /// Every request so far, in the order received.
    pub fn requests(&self) -> Vec<Request> {
        self.requests.lock().unwrap().clone()
    }

    /// Requests received and not answered yet.
    pub fn in_flight(&self) -> usize {
        self.in_flight.load(SeqCst)
    }

    /// The most requests that were waiting for an answer at once.
    pub fn peak(&self) -> usize {
        self.peak.load(SeqCst)
    }

    /// Requests answered so far.
    pub fn answered(&self) -> usize {
        self.answered.load(SeqCst)
    }
}

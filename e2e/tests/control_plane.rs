//! The harness itself works: controller-manager, scheduler and kwok run pods; the stand-in
//! runner behaves like a kubelet; the unprivileged token really is unprivileged.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, DeleteParams, ListParams, PostParams};
use nix::sys::signal::Signal;
use serde_json::json;

use crate::support::standin::{NODE, StandIn};
use crate::support::{TestEnv, client_for, eventually};

crate::tests![control_plane:
    deployment_pods_run_on_kwok_node,
    stand_in_gets_pod_identity_and_sigterm_on_delete,
    stand_in_sigkill_after_grace_period,
    stand_in_exit_makes_pod_terminal,
    unprivileged_token_is_denied,
];

const DEADLINE: Duration = Duration::from_secs(60);

async fn deployment_pods_run_on_kwok_node(env: Arc<TestEnv>) {
    let deployments: Api<Deployment> = env.api();
    let deployment: Deployment = serde_json::from_value(json!({
        "metadata": {"name": "web"},
        "spec": {
            "replicas": 3,
            "selector": {"matchLabels": {"app": "web"}},
            "template": {
                "metadata": {"labels": {"app": "web"}},
                "spec": {"containers": [{"name": "web", "image": "example.com/web:1.0.0"}]},
            },
        },
    }))
    .unwrap();
    deployments
        .create(&PostParams::default(), &deployment)
        .await
        .expect("creating deployment");
    let pods: Api<Pod> = env.api();
    let running = eventually("3 pods Running on the kwok node", DEADLINE, || async {
        let list = pods
            .list(&ListParams::default().labels("app=web"))
            .await
            .ok()?;
        let running: Vec<Pod> = list
            .items
            .into_iter()
            .filter(|p| p.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Running"))
            .collect();
        (running.len() == 3).then_some(running)
    })
    .await;
    for pod in running {
        assert_eq!(pod.spec.unwrap().node_name.as_deref(), Some(NODE));
    }
    let available = eventually(
        "the Deployment reports 3 available replicas",
        DEADLINE,
        || async {
            let d = deployments.get("web").await.ok()?;
            (d.status?.available_replicas? == 3).then_some(())
        },
    )
    .await;
    assert_eq!(available, ());
}

/// A shell script that records its pod identity, and exits 0 on SIGTERM.
const POLITE: &str = r#"echo "$POD_NAME $POD_NAMESPACE $POD_UID" > "$1"; trap 'echo term >> "$1"; exit 0' TERM; while :; do sleep 0.05; done"#;

async fn stand_in_gets_pod_identity_and_sigterm_on_delete(env: Arc<TestEnv>) {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("out");
    let out_s = out.to_str().unwrap();
    let labels = BTreeMap::from([("app".to_string(), "x".to_string())]);
    let si = StandIn::spawn(
        env.client.clone(),
        &env.ns,
        "polite",
        labels,
        10,
        "sh",
        &["-c", POLITE, "sh", out_s],
    )
    .await;
    let pods: Api<Pod> = env.api();
    let pod = pods.get("polite").await.unwrap();
    assert_eq!(pod.status.unwrap().phase.as_deref(), Some("Running"));
    assert_eq!(
        pod.metadata.labels.unwrap().get("app").map(String::as_str),
        Some("x")
    );
    let identity = eventually("the process to write its identity", DEADLINE, || async {
        std::fs::read_to_string(&out)
            .ok()
            .filter(|s| s.ends_with('\n'))
    })
    .await;
    assert_eq!(identity.trim(), format!("polite {} {}", env.ns, si.uid));

    pods.delete("polite", &DeleteParams::default())
        .await
        .unwrap();
    assert_eq!(
        si.wait_exit(DEADLINE).await,
        0,
        "the process exits 0 from its TERM trap"
    );
    assert!(std::fs::read_to_string(&out).unwrap().contains("term"));
    let sent: Vec<Signal> = si.signals.lock().unwrap().iter().map(|(s, _)| *s).collect();
    assert_eq!(sent.first(), Some(&Signal::SIGTERM));
    eventually("the pod object to be gone", DEADLINE, || async {
        pods.get_opt("polite").await.ok()?.is_none().then_some(())
    })
    .await;
}

async fn stand_in_sigkill_after_grace_period(env: Arc<TestEnv>) {
    // Ignores SIGTERM; a grandchild in the same group must die too.
    let script = r#"trap '' TERM; sleep 1000 & while :; do sleep 0.05; done"#;
    let si = StandIn::spawn(
        env.client.clone(),
        &env.ns,
        "stubborn",
        BTreeMap::new(),
        1,
        "sh",
        &["-c", script],
    )
    .await;
    let pods: Api<Pod> = env.api();
    pods.delete("stubborn", &DeleteParams::default())
        .await
        .unwrap();
    assert_eq!(si.wait_exit(DEADLINE).await, -9, "killed by SIGKILL");
    let sent = si.signals.lock().unwrap().clone();
    assert_eq!(
        sent.iter().map(|(s, _)| *s).take(2).collect::<Vec<_>>(),
        [Signal::SIGTERM, Signal::SIGKILL]
    );
    let waited = sent[1].1 - sent[0].1;
    assert!(
        waited >= Duration::from_secs(1),
        "SIGKILL came {waited:?} after SIGTERM, before the grace period"
    );
    // Nothing of the "container" (the process's session) survives, the grandchild included.
    eventually("the whole container to be gone", DEADLINE, || async {
        crate::support::standin::session_members(si.pid)
            .is_empty()
            .then_some(())
    })
    .await;
    eventually("the pod object to be gone", DEADLINE, || async {
        pods.get_opt("stubborn").await.ok()?.is_none().then_some(())
    })
    .await;
}

async fn stand_in_exit_makes_pod_terminal(env: Arc<TestEnv>) {
    let si = StandIn::spawn(
        env.client.clone(),
        &env.ns,
        "quitter",
        BTreeMap::new(),
        5,
        "sh",
        &["-c", "exit 3"],
    )
    .await;
    assert_eq!(si.wait_exit(DEADLINE).await, 3);
    let pods: Api<Pod> = env.api();
    let phase = eventually("the pod to be Failed", DEADLINE, || async {
        let phase = pods.get("quitter").await.ok()?.status?.phase?;
        (phase == "Failed").then_some(phase)
    })
    .await;
    assert_eq!(phase, "Failed");
    pods.delete("quitter", &DeleteParams::default())
        .await
        .unwrap();
    eventually("the terminal pod to be removed", DEADLINE, || async {
        pods.get_opt("quitter").await.ok()?.is_none().then_some(())
    })
    .await;
}

async fn unprivileged_token_is_denied(env: Arc<TestEnv>) {
    let path = env.kubeconfig.with_file_name("kubeconfig-unprivileged");
    let client = client_for(&path).await;
    let pods: Api<Pod> = Api::namespaced(client, &env.ns);
    match pods.list(&ListParams::default()).await {
        Err(kube::Error::Api(status)) => assert_eq!(status.code, 403, "{status:?}"),
        other => panic!("the unprivileged user could list pods: {other:?}"),
    }
}

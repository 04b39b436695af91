//! The LeaseCandidate CRD on a real API server: installed, Established, and refusing bad specs
//! at admission with a readable message.

use std::sync::Arc;
use std::time::Duration;

use arbiter::api::LeaseCandidate;
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::api::{Api, DynamicObject, Patch, PatchParams, PostParams};
use kube::core::{ApiResource, GroupVersionKind};
use kube::{CustomResourceExt, Resource, ResourceExt};
use serde_json::{Value, json};

use crate::support::{TestEnv, eventually};

crate::tests![crd:
    established_and_served,
    valid_candidates_accepted,
    missing_lease_name_refused,
    invalid_lease_name_refused,
    changed_lease_name_refused,
    malformed_binary_version_refused,
    malformed_emulation_version_refused,
    missing_binary_version_refused,
    unknown_unqualified_strategy_refused,
    too_many_slashes_strategy_refused,
    missing_strategy_refused,
    oldest_emulation_version_needs_emulation_version,
    emulation_above_binary_refused,
    printer_columns,
    list_map_conditions_from_an_older_crd_are_upgraded,
];

fn candidates(env: &TestEnv) -> Api<DynamicObject> {
    let ar = ApiResource::from_gvk_with_plural(
        &GroupVersionKind::gvk("arbiter.dev", "v1alpha1", "LeaseCandidate"),
        "leasecandidates",
    );
    Api::namespaced_with(env.client.clone(), &env.ns, &ar)
}

fn object(name: &str, spec: Value) -> DynamicObject {
    serde_json::from_value(json!({
        "apiVersion": "arbiter.dev/v1alpha1",
        "kind": "LeaseCandidate",
        "metadata": {"name": name},
        "spec": spec,
    }))
    .expect("a well-formed object")
}

fn valid_spec() -> Value {
    json!({
        "leaseName": "my-lease",
        "binaryVersion": "1.31.0",
        "emulationVersion": "1.30.0",
        "strategy": "OldestEmulationVersion",
    })
}

/// `valid_spec()` with `field` set to `value` (or removed when `value` is null).
fn spec_with(field: &str, value: Value) -> Value {
    let mut spec = valid_spec();
    if value.is_null() {
        spec.as_object_mut().unwrap().remove(field);
    } else {
        spec[field] = value;
    }
    spec
}

/// Creates a candidate with `spec` and asserts the API server refuses it as invalid (422) with
/// a message containing `expected`.
async fn assert_refused(env: &TestEnv, spec: Value, expected: &str) {
    let err = candidates(env)
        .create(&PostParams::default(), &object("bad", spec.clone()))
        .await
        .expect_err(&format!("the API server accepted an invalid spec {spec}"));
    match err {
        kube::Error::Api(status) => {
            assert_eq!(status.code, 422, "unexpected status for {spec}: {status:?}");
            assert!(
                status.message.contains(expected),
                "message for {spec} does not contain {expected:?}: {}",
                status.message
            );
        }
        other => panic!("unexpected error for {spec}: {other}"),
    }
}

async fn established_and_served(env: Arc<TestEnv>) {
    let crds: Api<CustomResourceDefinition> = Api::all(env.client.clone());
    let crd = crds
        .get(LeaseCandidate::crd_name())
        .await
        .expect("the CRD exists");
    let conditions = crd.status.and_then(|s| s.conditions).unwrap_or_default();
    assert!(
        conditions
            .iter()
            .any(|c| c.type_ == "Established" && c.status == "True"),
        "CRD not Established: {conditions:?}"
    );
    // The typed API works end to end: list (empty) in a fresh namespace.
    let typed: Api<LeaseCandidate> = env.api();
    assert!(
        typed
            .list(&Default::default())
            .await
            .expect("list")
            .items
            .is_empty()
    );
    assert_eq!(LeaseCandidate::api_version(&()), "arbiter.dev/v1alpha1");
}

async fn valid_candidates_accepted(env: Arc<TestEnv>) {
    let api: Api<LeaseCandidate> = env.api();
    let oev: LeaseCandidate =
        serde_json::from_value(serde_json::to_value(object("oev", valid_spec())).unwrap()).unwrap();
    let created = api
        .create(&PostParams::default(), &oev)
        .await
        .expect("a valid OEV candidate");
    assert_eq!(created.spec.binary_version, "1.31.0");
    assert_eq!(created.spec.emulation_version.as_deref(), Some("1.30.0"));
    // A third-party strategy needs no emulationVersion; pre-release versions are semver too.
    let third_party = object(
        "third-party",
        json!({"leaseName": "my-lease", "binaryVersion": "1.32.0-rc.1", "strategy": "example.com/foo"}),
    );
    candidates(&env)
        .create(&PostParams::default(), &third_party)
        .await
        .expect("a valid third-party candidate");
    // Versions and strategy may change; only leaseName is immutable.
    candidates(&env)
        .patch(
            "oev",
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"binaryVersion": "1.32.0"}})),
        )
        .await
        .expect("changing binaryVersion is allowed");
}

async fn missing_lease_name_refused(env: Arc<TestEnv>) {
    assert_refused(
        &env,
        spec_with("leaseName", Value::Null),
        "spec.leaseName: Required value",
    )
    .await;
}

async fn invalid_lease_name_refused(env: Arc<TestEnv>) {
    assert_refused(
        &env,
        spec_with("leaseName", json!("Bad_Name")),
        "leaseName must be a valid Lease name",
    )
    .await;
}

async fn changed_lease_name_refused(env: Arc<TestEnv>) {
    let api = candidates(&env);
    api.create(&PostParams::default(), &object("c1", valid_spec()))
        .await
        .expect("valid candidate");
    let err = api
        .patch(
            "c1",
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"leaseName": "other"}})),
        )
        .await
        .expect_err("changing leaseName must be refused");
    match err {
        kube::Error::Api(status) => {
            assert_eq!(status.code, 422, "{status:?}");
            assert!(
                status.message.contains("leaseName is immutable"),
                "{}",
                status.message
            );
        }
        other => panic!("unexpected error: {other}"),
    }
}

async fn malformed_binary_version_refused(env: Arc<TestEnv>) {
    for bad in [
        "1.30.1.6",
        "abc",
        "v1.30.0",
        "1.30",
        "01.30.0",
        "1.30.0-",
        "1.30.0+",
        "1.30.0-01",
    ] {
        assert_refused(
            &env,
            spec_with("binaryVersion", json!(bad)),
            "binaryVersion must be a semantic version MAJOR.MINOR.PATCH",
        )
        .await;
    }
}

async fn malformed_emulation_version_refused(env: Arc<TestEnv>) {
    for bad in ["1.30.1.6", "abc"] {
        assert_refused(
            &env,
            spec_with("emulationVersion", json!(bad)),
            "emulationVersion must be a semantic version MAJOR.MINOR.PATCH",
        )
        .await;
    }
}

async fn missing_binary_version_refused(env: Arc<TestEnv>) {
    assert_refused(
        &env,
        spec_with("binaryVersion", Value::Null),
        "spec.binaryVersion: Required value",
    )
    .await;
}

async fn unknown_unqualified_strategy_refused(env: Arc<TestEnv>) {
    assert_refused(
        &env,
        spec_with("strategy", json!("foo")),
        "unknown strategy: the only built-in strategy is OldestEmulationVersion",
    )
    .await;
}

async fn too_many_slashes_strategy_refused(env: Arc<TestEnv>) {
    for bad in [
        "a.com/b/c",
        "example.com/foobar/toomanyslashes",
        "/foo",
        "Example.com/foo",
    ] {
        assert_refused(
            &env,
            spec_with("strategy", json!(bad)),
            "a third-party strategy must be a qualified name PREFIX/NAME with exactly one '/'",
        )
        .await;
    }
}

async fn missing_strategy_refused(env: Arc<TestEnv>) {
    assert_refused(
        &env,
        spec_with("strategy", Value::Null),
        "spec.strategy: Required value",
    )
    .await;
}

async fn oldest_emulation_version_needs_emulation_version(env: Arc<TestEnv>) {
    assert_refused(
        &env,
        spec_with("emulationVersion", Value::Null),
        "emulationVersion is required when strategy is OldestEmulationVersion",
    )
    .await;
}

async fn emulation_above_binary_refused(env: Arc<TestEnv>) {
    let mut spec = spec_with("emulationVersion", json!("1.30.0"));
    spec["binaryVersion"] = json!("1.29.0");
    assert_refused(
        &env,
        spec,
        "emulationVersion must not be greater than binaryVersion",
    )
    .await;
    // Numeric, not lexicographic: 1.9.0 < 1.10.0.
    let mut spec = spec_with("emulationVersion", json!("1.9.0"));
    spec["binaryVersion"] = json!("1.10.0");
    candidates(&env)
        .create(&PostParams::default(), &object("numeric", spec))
        .await
        .expect("1.9.0 <= 1.10.0");
    // A pre-release is below its release; build metadata does not count.
    let mut spec = spec_with("emulationVersion", json!("1.31.0"));
    spec["binaryVersion"] = json!("1.31.0-rc.1");
    assert_refused(
        &env,
        spec,
        "emulationVersion must not be greater than binaryVersion",
    )
    .await;
    for (emulation, binary) in [
        ("1.31.0-rc.1", "1.31.0"),
        ("1.31.0+build.5", "1.31.0"),
        ("1.31.0", "1.31.0+build.5"),
    ] {
        let mut spec = spec_with("emulationVersion", json!(emulation));
        spec["binaryVersion"] = json!(binary);
        let name = format!("e{}", emulation.len() * 100 + binary.len());
        candidates(&env)
            .create(&PostParams::default(), &object(&name, spec))
            .await
            .unwrap_or_else(|e| panic!("{emulation} <= {binary}: {e}"));
    }
}

async fn printer_columns(env: Arc<TestEnv>) {
    candidates(&env)
        .create(&PostParams::default(), &object("c1", valid_spec()))
        .await
        .expect("valid candidate");
    let out = std::process::Command::new("kubectl")
        .env("KUBECONFIG", &env.kubeconfig)
        .args(["get", "leasecandidates.arbiter.dev", "-n", &env.ns])
        .output()
        .expect("running kubectl");
    assert!(
        out.status.success(),
        "kubectl get failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let text = String::from_utf8_lossy(&out.stdout);
    let mut lines = text.lines();
    let header: Vec<&str> = lines
        .next()
        .unwrap_or_default()
        .split_whitespace()
        .collect();
    assert_eq!(
        header,
        [
            "NAME",
            "LEASE",
            "BINARY",
            "EMULATION",
            "STRATEGY",
            "ELIGIBLE",
            "REASON",
            "AGE"
        ],
        "{text}"
    );
    let row: Vec<&str> = lines
        .next()
        .unwrap_or_default()
        .split_whitespace()
        .collect();
    assert_eq!(
        row[..5],
        [
            "c1",
            "my-lease",
            "1.31.0",
            "1.30.0",
            "OldestEmulationVersion"
        ],
        "{text}"
    );
}

/// The CRD up to 1ee1c65 declared `status.conditions` a list-map; it is an atomic list now.
/// Upgrading a CRD that another field manager (helm, kubectl) installed with the list-map goes
/// through by the operator's server-side apply, even with two replicas applying at once, and
/// leaves no list-map keys behind; an object written under the list-map takes status writes
/// afterwards, tracked as one list. On a scratch
/// copy of the CRD under its own group, so that the shared cluster's LeaseCandidates (and every
/// other test's watches on them) are untouched.
async fn list_map_conditions_from_an_older_crd_are_upgraded(env: Arc<TestEnv>) {
    const CONDITIONS: &str =
        "/spec/versions/0/schema/openAPIV3Schema/properties/status/properties/conditions";
    let group = format!("{}.upgrade.e2e.arbiter.dev", env.ns);
    let probe = |list_map: bool| -> CustomResourceDefinition {
        let mut crd = serde_json::to_value(LeaseCandidate::crd()).unwrap();
        crd["metadata"] = json!({ "name": format!("upgradeprobes.{group}") });
        crd["spec"]["group"] = json!(group);
        crd["spec"]["names"] = json!({
            "kind": "UpgradeProbe", "plural": "upgradeprobes", "singular": "upgradeprobe",
        });
        if list_map {
            let list = crd.pointer_mut(CONDITIONS).unwrap();
            list["x-kubernetes-list-type"] = json!("map");
            list["x-kubernetes-list-map-keys"] = json!(["type"]);
        }
        serde_json::from_value(crd).unwrap()
    };
    let crds: Api<CustomResourceDefinition> = Api::all(env.client.clone());
    let name = probe(false).name_any();
    // The older CRD, created by another field manager, and an object with its conditions.
    let pp = PostParams {
        field_manager: Some("helm".into()),
        ..Default::default()
    };
    crds.create(&pp, &probe(true)).await.expect("the older CRD");
    let ar = ApiResource::from_gvk_with_plural(
        &GroupVersionKind::gvk(&group, "v1alpha1", "UpgradeProbe"),
        "upgradeprobes",
    );
    let probes: Api<DynamicObject> = Api::namespaced_with(env.client.clone(), &env.ns, &ar);
    let mut object = object("p", valid_spec());
    object.types = Some(kube::core::TypeMeta {
        api_version: format!("{group}/v1alpha1"),
        kind: "UpgradeProbe".into(),
    });
    eventually(
        "the older CRD to serve objects",
        Duration::from_secs(30),
        || {
            let (probes, object) = (probes.clone(), object.clone());
            async move { probes.create(&PostParams::default(), &object).await.ok() }
        },
    )
    .await;
    let status = |leader: bool| {
        let condition = |type_: &str, ok: bool| {
            json!({"type": type_, "status": if ok { "True" } else { "False" }, "reason": "R",
                   "message": "", "lastTransitionTime": "2026-12-03T00:00:00Z"})
        };
        let conditions = [condition("Leader", leader), condition("Eligible", true)];
        json!({ "status": { "conditions": conditions } })
    };
    let keyed = |o: &DynamicObject| {
        o.managed_fields().iter().any(|m| {
            m.subresource.as_deref() == Some("status")
                && m.fields_v1
                    .as_ref()
                    .is_some_and(|f| f.0.to_string().contains("k:{\\\"type\\\""))
        })
    };
    let written = probes
        .patch_status("p", &PatchParams::default(), &Patch::Merge(&status(true)))
        .await
        .expect("a status write under the list-map");
    assert!(keyed(&written), "the list-map tracks each condition");

    // Two replicas upgrading at once, each by server-side apply: both go through, and the
    // keys another manager wrote do not survive (the apply takes `spec.versions` whole).
    let apply =
        || arbiter::api::apply_crd(env.client.clone(), probe(false), Duration::from_secs(30));
    let (a, b) = tokio::join!(apply(), apply());
    a.expect("the first replica's apply");
    b.expect("the second replica's apply");
    let crd = serde_json::to_value(crds.get(&name).await.expect("the CRD")).unwrap();
    let list = crd.pointer(CONDITIONS).unwrap();
    assert_eq!(list["x-kubernetes-list-type"], "atomic", "{list}");
    assert!(list.get("x-kubernetes-list-map-keys").is_none(), "{list}");

    // The object written under the list-map takes status writes, tracked as one list.
    let mut leader = false;
    eventually(
        "a status write tracked as an atomic list",
        Duration::from_secs(30),
        || {
            leader = !leader;
            let (probes, patch) = (probes.clone(), status(leader));
            async move {
                let o = probes
                    .patch_status("p", &PatchParams::default(), &Patch::Merge(&patch))
                    .await
                    .expect("a status write after the upgrade");
                (!keyed(&o)).then_some(())
            }
        },
    )
    .await;
    let _ = crds.delete(&name, &Default::default()).await;
}

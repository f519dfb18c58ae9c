//! The AdmissionReview as the webhook reads and answers it.
//!
//! Only the fields the decision or the log reads are kept; strings are borrowed
//! from the request body where JSON allows. `spec.template` is checked for
//! well-formed JSON and skipped instead of copied: the pod template does not
//! change the estimate and is kept as written.
//!
//! The object and the old object are read one of two ways. [`Job`] reads a
//! valid TrainingJob straight into its type and fails on anything else;
//! [`Object`] reads any object's top-level keys as JSON values, which
//! `parse::training_job` then checks with errors that name the field. The
//! server tries the first and falls back to the second, so a valid job is
//! parsed once and an invalid one gets the same answer either way.
//!
//! Fields that kube's `AdmissionRequest` requires (`uid`, `kind`, `resource`,
//! `operation`, `userInfo`) are required here too, so a review it would reject
//! is still answered with 400.

use std::borrow::Cow;
use std::fmt;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::core::Status;
use kube::core::admission::Operation;
use serde::de::{
    self, DeserializeSeed, Deserializer, IgnoredAny, IntoDeserializer, MapAccess, SeqAccess,
    Visitor,
};
use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};

use crate::api::parse::{self, ParseError};
use crate::api::{TrainingJob, TrainingJobSpec, TrainingJobStatus};

/// The kind of an AdmissionReview.
pub const KIND: &str = "AdmissionReview";
/// The admission API version answered when the review cannot be read.
pub const API_VERSION: &str = "admission.k8s.io/v1";

/// An incoming AdmissionReview; `O` reads the object and the old object.
#[derive(Debug, Deserialize)]
#[serde(rename = "AdmissionReview", rename_all = "camelCase")]
pub struct Review<'a, O = Object> {
    #[serde(borrow)]
    pub api_version: Cow<'a, str>,
    #[serde(borrow)]
    pub kind: Cow<'a, str>,
    #[serde(borrow, default = "none")]
    pub request: Option<Request<'a, O>>,
}

/// The default of an `Option` of a type parameter (serde's plain `default`
/// would ask the parameter itself for a default).
fn none<T>() -> Option<T> {
    None
}

/// The request of a review.
#[derive(Debug, Deserialize)]
#[serde(rename = "AdmissionRequest", rename_all = "camelCase")]
pub struct Request<'a, O = Object> {
    #[serde(borrow)]
    pub uid: Cow<'a, str>,
    #[serde(borrow)]
    pub kind: Kind<'a>,
    #[serde(rename = "resource")]
    _resource: IgnoredAny,
    #[serde(borrow, default)]
    pub name: Cow<'a, str>,
    #[serde(borrow, default)]
    pub namespace: Option<Cow<'a, str>>,
    pub operation: Operation,
    #[serde(rename = "userInfo")]
    _user_info: IgnoredAny,
    #[serde(default = "none")]
    pub object: Option<O>,
    #[serde(default = "none")]
    pub old_object: Option<O>,
    #[serde(default)]
    pub dry_run: bool,
}

/// The group, version and kind of the object under review.
#[derive(Debug, Deserialize)]
pub struct Kind<'a> {
    #[serde(borrow)]
    pub group: Cow<'a, str>,
    #[serde(borrow)]
    pub version: Cow<'a, str>,
    #[serde(borrow)]
    pub kind: Cow<'a, str>,
}

/// The object (or old object) of a review: its top-level keys as JSON, with
/// `spec.template` left out.
#[derive(Debug, Default, PartialEq)]
pub struct Object(pub Map<String, Value>);

impl Object {
    /// The object as one JSON value.
    pub fn into_value(self) -> Value {
        Value::Object(self.0)
    }
}

impl<'de> Deserialize<'de> for Object {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Object, D::Error> {
        struct ObjectVisitor;
        impl<'de> Visitor<'de> for ObjectVisitor {
            type Value = Object;
            fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                f.write_str("a Kubernetes object")
            }
            fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Object, A::Error> {
                let mut out = Map::new();
                while let Some(key) = map.next_key::<String>()? {
                    let value = if key == "spec" {
                        map.next_value::<WithoutTemplate>()?.0
                    } else {
                        map.next_value::<Value>()?
                    };
                    out.insert(key, value);
                }
                Ok(Object(out))
            }
        }
        d.deserialize_map(ObjectVisitor)
    }
}

/// An object under review as a TrainingJob.
pub trait ReadJob {
    fn read_job(self) -> Result<TrainingJob, ParseError>;
}

impl ReadJob for Object {
    fn read_job(self) -> Result<TrainingJob, ParseError> {
        parse::training_job(self.into_value())
    }
}

/// A valid TrainingJob read straight from the review (`spec.template` left
/// out, as `parse::training_job` never sees it through [`Object`] either).
/// Anything `parse::training_job` would reject fails to deserialize: a wrong
/// apiVersion or kind, an unknown or repeated key, a missing spec, a field
/// of the wrong type.
#[derive(Debug)]
pub struct Job(pub TrainingJob);

impl ReadJob for Job {
    fn read_job(self) -> Result<TrainingJob, ParseError> {
        Ok(self.0)
    }
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct JobDoc {
    #[serde(rename = "apiVersion", deserialize_with = "api_version")]
    _api_version: (),
    #[serde(rename = "kind", deserialize_with = "job_kind")]
    _kind: (),
    #[serde(default)]
    metadata: ObjectMeta,
    #[serde(deserialize_with = "spec_without_template")]
    spec: TrainingJobSpec,
    #[serde(default)]
    status: Option<TrainingJobStatus>,
}

impl<'de> Deserialize<'de> for Job {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Job, D::Error> {
        let doc = JobDoc::deserialize(d)?;
        Ok(Job(TrainingJob {
            metadata: doc.metadata,
            spec: doc.spec,
            status: doc.status,
        }))
    }
}

/// A string that must equal `.0`.
struct Exactly(&'static str);

impl<'de> Visitor<'de> for Exactly {
    type Value = ();
    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        write!(f, "{:?}", self.0)
    }
    fn visit_str<E: de::Error>(self, v: &str) -> Result<(), E> {
        if v == self.0 {
            Ok(())
        } else {
            Err(E::invalid_value(de::Unexpected::Str(v), &self))
        }
    }
}

fn api_version<'de, D: Deserializer<'de>>(d: D) -> Result<(), D::Error> {
    d.deserialize_str(Exactly(parse::API_VERSION))
}

fn job_kind<'de, D: Deserializer<'de>>(d: D) -> Result<(), D::Error> {
    d.deserialize_str(Exactly("TrainingJob"))
}

fn spec_without_template<'de, D: Deserializer<'de>>(d: D) -> Result<TrainingJobSpec, D::Error> {
    TrainingJobSpec::deserialize(WithoutTemplateKey(d))
}

/// A deserializer whose top-level map hides its `template` entry (the value
/// is still checked for well-formed JSON). Anything but a map is an error.
struct WithoutTemplateKey<D>(D);

impl<'de, D: Deserializer<'de>> Deserializer<'de> for WithoutTemplateKey<D> {
    type Error = D::Error;
    fn deserialize_any<V: Visitor<'de>>(self, v: V) -> Result<V::Value, D::Error> {
        self.0.deserialize_map(HideTemplate(v))
    }
    fn deserialize_struct<V: Visitor<'de>>(
        self,
        name: &'static str,
        fields: &'static [&'static str],
        v: V,
    ) -> Result<V::Value, D::Error> {
        self.0.deserialize_struct(name, fields, HideTemplate(v))
    }
    serde::forward_to_deserialize_any! {
        bool i8 i16 i32 i64 i128 u8 u16 u32 u64 u128 f32 f64 char str string
        bytes byte_buf option unit unit_struct newtype_struct seq tuple
        tuple_struct map enum identifier ignored_any
    }
}

/// Passes a map on without its `template` entry; anything else is an error.
struct HideTemplate<V>(V);

impl<'de, V: Visitor<'de>> Visitor<'de> for HideTemplate<V> {
    type Value = V::Value;
    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        self.0.expecting(f)
    }
    fn visit_map<A: MapAccess<'de>>(self, map: A) -> Result<V::Value, A::Error> {
        self.0.visit_map(HiddenTemplate(map))
    }
}

struct HiddenTemplate<A>(A);

impl<'de, A: MapAccess<'de>> MapAccess<'de> for HiddenTemplate<A> {
    type Error = A::Error;
    fn next_key_seed<K: DeserializeSeed<'de>>(
        &mut self,
        seed: K,
    ) -> Result<Option<K::Value>, A::Error> {
        while let Some(key) = self.0.next_key::<Key<'de>>()? {
            if key.0 == "template" {
                self.0.next_value::<IgnoredAny>()?;
                continue;
            }
            let key: &str = &key.0;
            return seed.deserialize(key.into_deserializer()).map(Some);
        }
        Ok(None)
    }
    fn next_value_seed<S: DeserializeSeed<'de>>(&mut self, seed: S) -> Result<S::Value, A::Error> {
        self.0.next_value_seed(seed)
    }
}

/// A map key, borrowed from the input unless it holds escapes.
struct Key<'de>(Cow<'de, str>);

impl<'de> Deserialize<'de> for Key<'de> {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Key<'de>, D::Error> {
        struct KeyVisitor;
        impl<'de> Visitor<'de> for KeyVisitor {
            type Value = Key<'de>;
            fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                f.write_str("a string")
            }
            fn visit_borrowed_str<E>(self, v: &'de str) -> Result<Key<'de>, E> {
                Ok(Key(Cow::Borrowed(v)))
            }
            fn visit_str<E>(self, v: &str) -> Result<Key<'de>, E> {
                Ok(Key(Cow::Owned(v.to_owned())))
            }
            fn visit_string<E>(self, v: String) -> Result<Key<'de>, E> {
                Ok(Key(Cow::Owned(v)))
            }
        }
        d.deserialize_str(KeyVisitor)
    }
}

/// A JSON value; when it is an object, its `template` key is skipped.
struct WithoutTemplate(Value);

impl<'de> Deserialize<'de> for WithoutTemplate {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<WithoutTemplate, D::Error> {
        d.deserialize_any(WithoutTemplateVisitor)
            .map(WithoutTemplate)
    }
}

struct WithoutTemplateVisitor;

/// Everything but maps as `serde_json::Value` reads it.
impl<'de> Visitor<'de> for WithoutTemplateVisitor {
    type Value = Value;
    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("any valid JSON value")
    }
    fn visit_bool<E>(self, v: bool) -> Result<Value, E> {
        Ok(Value::Bool(v))
    }
    fn visit_i64<E>(self, v: i64) -> Result<Value, E> {
        Ok(Value::from(v))
    }
    fn visit_u64<E>(self, v: u64) -> Result<Value, E> {
        Ok(Value::from(v))
    }
    fn visit_f64<E>(self, v: f64) -> Result<Value, E> {
        Ok(Value::from(v))
    }
    fn visit_str<E: de::Error>(self, v: &str) -> Result<Value, E> {
        Ok(Value::String(v.to_owned()))
    }
    fn visit_string<E>(self, v: String) -> Result<Value, E> {
        Ok(Value::String(v))
    }
    fn visit_none<E>(self) -> Result<Value, E> {
        Ok(Value::Null)
    }
    fn visit_some<D: Deserializer<'de>>(self, d: D) -> Result<Value, D::Error> {
        Value::deserialize(d)
    }
    fn visit_unit<E>(self) -> Result<Value, E> {
        Ok(Value::Null)
    }
    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Value, A::Error> {
        let mut out = Vec::with_capacity(seq.size_hint().unwrap_or(0));
        while let Some(v) = seq.next_element::<Value>()? {
            out.push(v);
        }
        Ok(Value::Array(out))
    }
    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Value, A::Error> {
        let mut out = Map::new();
        while let Some(key) = map.next_key::<String>()? {
            if key == "template" {
                map.next_value::<IgnoredAny>()?;
            } else {
                let value = map.next_value::<Value>()?;
                out.insert(key, value);
            }
        }
        Ok(Value::Object(out))
    }
}

/// An outgoing AdmissionReview carrying one response.
#[derive(Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Answer<'a> {
    pub api_version: &'a str,
    pub kind: &'a str,
    pub response: Response<'a>,
}

/// The response of an answered review (kube's `AdmissionResponse` without a patch).
#[derive(Debug, Serialize)]
pub struct Response<'a> {
    pub uid: &'a str,
    pub allowed: bool,
    pub status: &'a Status,
    #[serde(skip_serializing_if = "<[String]>::is_empty")]
    pub warnings: &'a [String],
}

/// The `request.uid` of a review from the first bytes of its body, which may
/// stop anywhere (a body over the limit is read only so far): `None` when those
/// bytes end (or go wrong) before the uid. Every other value is skipped unread.
pub fn uid_in_prefix(prefix: &[u8]) -> Option<String> {
    /// Stops the reading with an error once the uid is found.
    const FOUND: &str = "uid found";
    struct Top<'u>(&'u mut Option<String>);
    struct Request<'u>(&'u mut Option<String>);
    impl<'de> DeserializeSeed<'de> for Top<'_> {
        type Value = ();
        fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<(), D::Error> {
            d.deserialize_map(self)
        }
    }
    impl<'de> Visitor<'de> for Top<'_> {
        type Value = ();
        fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
            f.write_str("an AdmissionReview")
        }
        fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<(), A::Error> {
            while let Some(key) = map.next_key::<Cow<'de, str>>()? {
                if key == "request" {
                    map.next_value_seed(Request(&mut *self.0))?;
                } else {
                    map.next_value::<IgnoredAny>()?;
                }
            }
            Ok(())
        }
    }
    impl<'de> DeserializeSeed<'de> for Request<'_> {
        type Value = ();
        fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<(), D::Error> {
            d.deserialize_map(self)
        }
    }
    impl<'de> Visitor<'de> for Request<'_> {
        type Value = ();
        fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
            f.write_str("an AdmissionRequest")
        }
        fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<(), A::Error> {
            while let Some(key) = map.next_key::<Cow<'de, str>>()? {
                if key == "uid" {
                    *self.0 = Some(map.next_value::<String>()?);
                    return Err(de::Error::custom(FOUND));
                }
                map.next_value::<IgnoredAny>()?;
            }
            Ok(())
        }
    }
    let mut uid = None;
    let _ = Top(&mut uid).deserialize(&mut serde_json::Deserializer::from_slice(prefix));
    uid
}

#[cfg(test)]
mod tests {
    use super::*;
    use kube::core::DynamicObject;
    use kube::core::admission::{AdmissionRequest, AdmissionResponse, AdmissionReview};

    pub(super) const FITS: &str = include_str!("../../examples/admission/create-fits.json");

    #[test]
    fn reads_what_the_decision_needs() {
        let review: Review<'_> = serde_json::from_str(FITS).unwrap();
        assert_eq!(review.api_version, "admission.k8s.io/v1");
        let req = review.request.unwrap();
        assert!(matches!(req.uid, Cow::Borrowed(_)), "borrowed, not copied");
        assert_eq!(req.kind.group, "vramguard.io");
        assert_eq!(req.kind.kind, "TrainingJob");
        assert_eq!(req.name, "llama-3-1-8b-lora");
        assert_eq!(req.operation, Operation::Create);
        assert!(req.old_object.is_none());
        let obj = req.object.unwrap().into_value();
        assert_eq!(obj["spec"]["model"]["preset"], "llama-3.1-8b");
        assert_eq!(obj["metadata"]["name"], "llama-3-1-8b-lora");
        assert!(obj["spec"].get("template").is_none(), "template left out");
    }

    #[test]
    fn only_the_spec_template_is_left_out() {
        let obj: Object = serde_json::from_str(
            r#"{"template":1,"spec":{"template":{"a":[1,{"b":null}]},"x":{"template":2}}}"#,
        )
        .unwrap();
        assert_eq!(
            obj.into_value(),
            serde_json::json!({"template":1,"spec":{"x":{"template":2}}})
        );
        for spec in [
            "\"s\"",
            "3",
            "-3",
            "1.5",
            "null",
            "true",
            "[1,{\"template\":1}]",
        ] {
            let obj: Object = serde_json::from_str(&format!(r#"{{"spec":{spec}}}"#)).unwrap();
            let want: Value = serde_json::from_str(spec).unwrap();
            assert_eq!(obj.into_value()["spec"], want, "{spec}");
        }
        assert!(serde_json::from_str::<Object>("[]").is_err());
        assert!(serde_json::from_str::<Object>(r#"{"spec":{"template":[}}"#).is_err());
    }

    #[test]
    fn requires_what_kube_requires() {
        let full: Value = serde_json::from_str(FITS).unwrap();
        for field in ["uid", "kind", "resource", "operation", "userInfo"] {
            let mut v = full.clone();
            v["request"].as_object_mut().unwrap().remove(field);
            let text = v.to_string();
            assert!(
                serde_json::from_str::<Review<'_>>(&text).is_err(),
                "{field}"
            );
            assert!(
                serde_json::from_str::<AdmissionReview<DynamicObject>>(&text).is_err(),
                "{field}"
            );
        }
    }

    #[test]
    fn answers_as_kube_does() {
        let kube_review: AdmissionReview<DynamicObject> = serde_json::from_str(FITS).unwrap();
        let kube_req: AdmissionRequest<DynamicObject> = kube_review.try_into().unwrap();
        let ours: Review<'_> = serde_json::from_str(FITS).unwrap();
        let uid = ours.request.as_ref().unwrap().uid.clone();

        let mut denied = AdmissionResponse::from(&kube_req).deny("too big");
        denied.result.code = 403;
        denied.result.reason = "Forbidden".into();
        let mut allowed = AdmissionResponse::from(&kube_req);
        allowed.warnings = Some(vec!["a".into(), "b".into()]);
        for kube in [denied, allowed, AdmissionResponse::from(&kube_req)] {
            let warnings = kube.warnings.clone().unwrap_or_default();
            let answer = Answer {
                api_version: &ours.api_version,
                kind: &ours.kind,
                response: Response {
                    uid: &uid,
                    allowed: kube.allowed,
                    status: &kube.result,
                    warnings: &warnings,
                },
            };
            assert_eq!(
                serde_json::to_string(&answer).unwrap(),
                serde_json::to_string(&kube.into_review()).unwrap()
            );
        }
        let invalid = AdmissionResponse::invalid("bad");
        let answer = Answer {
            api_version: API_VERSION,
            kind: KIND,
            response: Response {
                uid: "",
                allowed: false,
                status: &invalid.result,
                warnings: &[],
            },
        };
        assert_eq!(
            serde_json::to_string(&answer).unwrap(),
            serde_json::to_string(&invalid.into_review()).unwrap()
        );
    }
}

#[cfg(test)]
mod job_tests {
    use super::*;

    fn example(name: &str) -> String {
        std::fs::read_to_string(
            std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
                .join("examples/admission")
                .join(name),
        )
        .unwrap()
    }

    /// Both ways of reading `text`'s object and old object, as JSON.
    fn both(text: &str) -> (Option<Vec<Value>>, Vec<Result<Value, String>>) {
        let as_json = |tj: TrainingJob| serde_json::to_value(tj).unwrap();
        let fast = serde_json::from_str::<Review<'_, Job>>(text).ok().map(|r| {
            let req = r.request.unwrap();
            [req.object, req.old_object]
                .into_iter()
                .flatten()
                .map(|j| as_json(j.read_job().unwrap()))
                .collect()
        });
        let req = serde_json::from_str::<Review<'_, Object>>(text)
            .unwrap()
            .request
            .unwrap();
        let slow = [req.object, req.old_object]
            .into_iter()
            .flatten()
            .map(|o| o.read_job().map(as_json).map_err(|e| e.to_string()))
            .collect();
        (fast, slow)
    }

    #[test]
    fn a_valid_job_reads_the_same_either_way() {
        for name in [
            "create-fits.json",
            "create-fits-after-change.json",
            "create-does-not-fit.json",
            "create-dry-run.json",
            "update-immutable.json",
            "delete.json",
        ] {
            let (fast, slow) = both(&example(name));
            let fast = fast.unwrap_or_else(|| panic!("{name} takes the direct path"));
            let slow: Vec<Value> = slow.into_iter().map(Result::unwrap).collect();
            assert_eq!(fast, slow, "{name}");
            assert!(fast.iter().all(|j| j["spec"].get("template").is_none()));
        }
        // Values the schema refuses: the general path names them all at once; the
        // direct path reads them and validation refuses them after.
        let (fast, slow) = both(&example("create-invalid.json"));
        assert!(fast.is_some());
        let e = slow[0].as_ref().expect_err("the schema refuses it");
        assert!(e.contains("is out of range; use a value 1 or more"), "{e}");
    }

    type Edit = Box<dyn Fn(&mut Value)>;

    #[test]
    fn anything_else_takes_the_general_path() {
        let fits: Value = serde_json::from_str(&example("create-fits.json")).unwrap();
        let edits: Vec<(&str, Edit)> = vec![
            ("apiVersion", Box::new(|o| o["apiVersion"] = "v1".into())),
            ("kind", Box::new(|o| o["kind"] = "Pod".into())),
            (
                "no kind",
                Box::new(|o| o.as_object_mut().unwrap().remove("kind").map(drop).unwrap()),
            ),
            ("unknown key", Box::new(|o| o["extra"] = 1.into())),
            (
                "no spec",
                Box::new(|o| o.as_object_mut().unwrap().remove("spec").map(drop).unwrap()),
            ),
            ("spec type", Box::new(|o| o["spec"] = "x".into())),
            ("spec key", Box::new(|o| o["spec"]["bogus"] = 1.into())),
            (
                "field type",
                Box::new(|o| o["spec"]["training"]["microBatchSize"] = "4".into()),
            ),
            ("metadata", Box::new(|o| o["metadata"]["name"] = 5.into())),
            ("status", Box::new(|o| o["status"] = "x".into())),
        ];
        for (what, edit) in edits {
            let mut review = fits.clone();
            edit(&mut review["request"]["object"]);
            let (fast, slow) = both(&review.to_string());
            assert!(fast.is_none(), "{what}");
            assert!(slow[0].is_err(), "{what}: {:?}", slow[0]);
        }
        // Repeated keys: the general path keeps the last, as before.
        let text = example("create-fits.json").replacen(
            "\"microBatchSize\": 4",
            "\"microBatchSize\": 4, \"microBatchSize\": 2",
            1,
        );
        let (fast, slow) = both(&text);
        assert!(fast.is_none());
        assert_eq!(
            slow[0].as_ref().unwrap()["spec"]["training"]["microBatchSize"],
            2
        );
    }

    #[test]
    fn the_template_is_skipped_whatever_it_holds() {
        let mut review: Value = serde_json::from_str(&example("create-fits.json")).unwrap();
        for template in [Value::Null, "x".into(), serde_json::json!([1, {"a": {}}])] {
            review["request"]["object"]["spec"]["template"] = template;
            let (fast, slow) = both(&review.to_string());
            assert_eq!(fast.unwrap()[0], *slow[0].as_ref().unwrap());
        }
    }

    #[test]
    fn the_uid_is_read_from_a_body_cut_anywhere_after_it() {
        let uid = "1f8e7a10-0001-4c1a-9c1e-000000000001";
        let at = super::tests::FITS.find(uid).unwrap() + uid.len() + 1;
        for cut in at..super::tests::FITS.len() {
            assert_eq!(
                uid_in_prefix(&super::tests::FITS.as_bytes()[..cut]).as_deref(),
                Some(uid),
                "{cut}"
            );
        }
        for cut in 0..at {
            assert_eq!(
                uid_in_prefix(&super::tests::FITS.as_bytes()[..cut]),
                None,
                "{cut}"
            );
        }
        // The object's own uid, or one outside `request`, is not the review's.
        let elsewhere = r#"{"uid":"a","request":{"object":{"metadata":{"uid":"b"}},"uid":"c"#;
        assert_eq!(uid_in_prefix(elsewhere.as_bytes()), None);
        let after = r#"{"uid":"a","request":{"object":{"metadata":{"uid":"b"}},"uid":"c","#;
        assert_eq!(uid_in_prefix(after.as_bytes()).as_deref(), Some("c"));
        assert_eq!(uid_in_prefix(b"     "), None);
        assert_eq!(uid_in_prefix(b"[{\"request\":{\"uid\":\"x\"}}]"), None);
    }
}

//! The AdmissionReview as the webhook reads and answers it.
//!
//! Only the fields the decision or the log reads are kept; strings are borrowed
//! from the request body where JSON allows. Of the object and the old object
//! the top-level keys are read as JSON values, except `spec.template`: the pod
//! template does not change the estimate and is kept as written, so it is
//! checked for well-formed JSON and skipped instead of copied.
//!
//! Fields that kube's `AdmissionRequest` requires (`uid`, `kind`, `resource`,
//! `operation`, `userInfo`) are required here too, so a review it would reject
//! is still answered with 400.

use std::borrow::Cow;
use std::fmt;

use kube::core::Status;
use kube::core::admission::Operation;
use serde::de::{self, Deserializer, IgnoredAny, MapAccess, SeqAccess, Visitor};
use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};

/// The kind of an AdmissionReview.
pub const KIND: &str = "AdmissionReview";
/// The admission API version answered when the review cannot be read.
pub const API_VERSION: &str = "admission.k8s.io/v1";

/// An incoming AdmissionReview.
#[derive(Debug, Deserialize)]
#[serde(rename = "AdmissionReview", rename_all = "camelCase")]
pub struct Review<'a> {
    #[serde(borrow)]
    pub api_version: Cow<'a, str>,
    #[serde(borrow)]
    pub kind: Cow<'a, str>,
    #[serde(borrow, default)]
    pub request: Option<Request<'a>>,
}

/// The request of a review.
#[derive(Debug, Deserialize)]
#[serde(rename = "AdmissionRequest", rename_all = "camelCase")]
pub struct Request<'a> {
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
    #[serde(default)]
    pub object: Option<Object>,
    #[serde(default)]
    pub old_object: Option<Object>,
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

#[cfg(test)]
mod tests {
    use super::*;
    use kube::core::DynamicObject;
    use kube::core::admission::{AdmissionRequest, AdmissionResponse, AdmissionReview};

    const FITS: &str = include_str!("../../examples/admission/create-fits.json");

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

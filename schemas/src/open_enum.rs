//! Open string enums: a closed set of known values plus `Other(String)` for
//! values a newer Slurm may send. An unknown value is kept verbatim, never a
//! decoding error (DESIGN.md invariant 4), and round-trips unchanged.
//!
//! serde's `#[serde(untagged)]` catch-all variant would do the same, but it
//! buffers every value before matching; these are decoded in the hot replay
//! path, so the visitor matches the borrowed string directly.

/// Defines an open string enum with serde and JSON Schema support.
macro_rules! open_enum {
    (
        $(#[$meta:meta])*
        pub enum $name:ident {
            $( $(#[$vmeta:meta])* $variant:ident => $text:literal, )+
        }
    ) => {
        $(#[$meta])*
        #[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
        pub enum $name {
            $( $(#[$vmeta])* $variant, )+
            /// A value this version of lockstep does not know, kept verbatim.
            Other(String),
        }

        impl $name {
            /// The wire spelling.
            pub fn as_str(&self) -> &str {
                match self {
                    $( Self::$variant => $text, )+
                    Self::Other(s) => s.as_str(),
                }
            }

            /// Parses the wire spelling; unknown values become `Other`.
            pub fn parse(s: &str) -> Self {
                match s {
                    $( $text => Self::$variant, )+
                    other => Self::Other(other.to_owned()),
                }
            }

            /// Whether this is a value lockstep knows.
            pub fn is_known(&self) -> bool {
                !matches!(self, Self::Other(_))
            }
        }

        impl std::fmt::Display for $name {
            fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str(self.as_str())
            }
        }

        impl serde::Serialize for $name {
            fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
                s.serialize_str(self.as_str())
            }
        }

        impl<'de> serde::Deserialize<'de> for $name {
            fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
                struct V;
                impl serde::de::Visitor<'_> for V {
                    type Value = $name;
                    fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                        f.write_str(concat!("a ", stringify!($name), " string"))
                    }
                    fn visit_str<E: serde::de::Error>(self, v: &str) -> Result<$name, E> {
                        Ok($name::parse(v))
                    }
                    fn visit_bytes<E: serde::de::Error>(self, v: &[u8]) -> Result<$name, E> {
                        std::str::from_utf8(v)
                            .map($name::parse)
                            .map_err(|_| E::invalid_value(serde::de::Unexpected::Bytes(v), &self))
                    }
                }
                d.deserialize_str(V)
            }
        }

        impl schemars::JsonSchema for $name {
            fn schema_name() -> std::borrow::Cow<'static, str> {
                stringify!($name).into()
            }
            fn json_schema(_: &mut schemars::SchemaGenerator) -> schemars::Schema {
                schemars::json_schema!({
                    "type": "string",
                    "description": concat!(
                        "Known values: ", $( $text, " ", )+
                        "; any other string is kept verbatim."
                    ),
                    "examples": [ $( $text ),+ ]
                })
            }
        }
    };
}

pub(crate) use open_enum;

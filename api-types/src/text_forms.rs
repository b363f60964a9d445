//! `as_str`, `parse` and `Display` for the closed sets, from one table per enum, so the text
//! form (as the store keeps it) and the serde form cannot drift (each enum's tests compare them).

macro_rules! text_forms {
    ($name:ident { $($variant:ident => $text:literal),+ $(,)? }) => {
        impl $name {
            /// Every value, in declaration order.
            pub const ALL: &'static [$name] = &[$($name::$variant),+];

            pub fn as_str(self) -> &'static str {
                match self { $($name::$variant => $text),+ }
            }

            /// The value named `text` (as the store keeps it), if it is one.
            pub fn parse(text: &str) -> Option<$name> {
                match text { $($text => Some($name::$variant),)+ _ => None }
            }
        }

        impl std::fmt::Display for $name {
            fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str(self.as_str())
            }
        }
    };
}

pub(crate) use text_forms;

/// Asserts that serde spells every value of `all` as its `as_str`, and reads it back.
#[cfg(test)]
pub(crate) fn assert_serde_matches<T>(all: &[T], as_str: impl Fn(&T) -> &'static str)
where
    T: serde::Serialize + serde::de::DeserializeOwned + PartialEq + std::fmt::Debug,
{
    for value in all {
        let text = as_str(value);
        assert_eq!(serde_json::to_value(value).unwrap(), text, "{value:?}");
        let back: T = serde_json::from_value(text.into()).unwrap();
        assert_eq!(&back, value);
    }
}

//! The roles a key can hold, defined with the API's wire types in the `api-types`
//! crate; re-exported here so `crate::role::Role` keeps its path. Keys store the role's name;
//! every check goes through [`Role`], so an unknown or misspelt name matches no role and is
//! refused.

pub use api_types::Role;

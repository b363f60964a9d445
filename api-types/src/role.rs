//! The roles a key can hold (`agent`, `reviewer`, `auditor`, `admin`), as one closed set. Keys
//! store the role's name; every check goes through [`Role`], so an unknown or misspelt name
//! matches no role and is refused (it can never pass as "not an agent", say, and see every
//! tenant).

/// What a key may do.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(rename_all = "snake_case")]
pub enum Role {
    /// Runs code, for its own tenant only.
    Agent,
    /// Lists and decides approvals.
    Reviewer,
    /// Reads the audit trail, metrics and every tenant's records.
    Auditor,
    /// Everything, keys and policy included.
    Admin,
}

impl Role {
    pub const ALL: [Role; 4] = [Role::Agent, Role::Reviewer, Role::Auditor, Role::Admin];
    /// The roles that see every tenant's records (all but agents).
    pub const ACROSS_TENANTS: [Role; 3] = [Role::Reviewer, Role::Auditor, Role::Admin];

    pub fn as_str(self) -> &'static str {
        match self {
            Role::Agent => "agent",
            Role::Reviewer => "reviewer",
            Role::Auditor => "auditor",
            Role::Admin => "admin",
        }
    }

    /// The role named `text`, if it is one.
    pub fn parse(text: &str) -> Option<Role> {
        Role::ALL.into_iter().find(|role| role.as_str() == text)
    }

    /// `"agent, reviewer"`: for messages.
    pub fn names(roles: &[Role]) -> String {
        roles
            .iter()
            .map(|role| role.as_str())
            .collect::<Vec<_>>()
            .join(", ")
    }
}

impl std::fmt::Display for Role {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_round_trip_and_nothing_else_is_a_role() {
        for role in Role::ALL {
            assert_eq!(Role::parse(role.as_str()), Some(role));
        }
        for text in ["", "Agent", "agent ", "root", "admins"] {
            assert_eq!(Role::parse(text), None, "{text:?}");
        }
        assert!(!Role::ACROSS_TENANTS.contains(&Role::Agent));
        crate::text_forms::assert_serde_matches(&Role::ALL, |role| role.as_str());
    }
}

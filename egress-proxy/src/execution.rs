//! What a connection sees of the proxy and of its execution: the proxy-wide [`Shared`] parts
//! and the [`Execution`] its socket belongs to. The listener builds both; a connection (`conn`,
//! `inspect`, `streams`) only reads them, so they live below both.

use std::sync::Arc;

use policy_engine::NetworkGrant;

use crate::addr::AddressPolicy;
use crate::config::{ExecutionLimits, Inspection, ProxyConfig};
use crate::denials::Denials;
use crate::relay::Budget;
use crate::seams::{ConnectionRecorder, EgressPolicy, Resolve};

/// What every listener shares.
pub(crate) struct Shared {
    pub config: ProxyConfig,
    pub policy: Arc<dyn EgressPolicy>,
    pub resolver: Arc<dyn Resolve>,
    pub recorder: Arc<dyn ConnectionRecorder>,
}

/// One execution, as its connections see it.
pub(crate) struct Execution {
    pub id: String,
    pub tenant: String,
    pub grant: NetworkGrant,
    pub limits: ExecutionLimits,
    pub addresses: AddressPolicy,
    pub budget: Budget,
    /// Denials recorded on their own so far, and those only counted.
    pub denials: Denials,
    /// The CA and credentials, when the grant inspects some destination.
    pub inspection: Option<Arc<Inspection>>,
}

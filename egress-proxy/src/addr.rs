//! The address table: which resolved or literal addresses the proxy may dial.
//!
//! Three outcomes:
//! - **always denied**, whatever the grant says: loopback, link-local (169.254/16, fe80::/10: the
//!   metadata services), unspecified and "this network" (0/8, ::), multicast, broadcast and the
//!   reserved 240/4, and the gateway's own addresses;
//! - **restricted**, denied unless the grant names the address or a range holding it (a grant
//!   host `10.0.0.5` or `10.0.0.0/8`): RFC 1918, CGNAT 100.64/10, 192.0.0/24, benchmarking
//!   198.18/15, ULA fc00::/7, site-local fec0::/10, and every IPv6 form that embeds an IPv4
//!   address (`::ffff:0:0/96` mapped, `::/96` compatible, NAT64 64:ff9b::/96 and 64:ff9b:1::/48,
//!   6to4 2002::/16, Teredo 2001::/32);
//! - **public**: everything else.
//!
//! An IPv6 form that embeds an IPv4 address is also classified by the embedded address, and the
//! stricter outcome wins: `64:ff9b::a9fe:a9fe` (NAT64 of 169.254.169.254) is always denied.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

/// Where an address falls in the table.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AddressClass {
    Public,
    /// Denied unless the grant names it; the text names the range.
    Restricted(&'static str),
    /// Denied, whatever the grant says; the text names the range.
    AlwaysDenied(&'static str),
}

/// Classifies one address by the table alone (the gateway's own addresses and the grant's
/// ranges are applied by [`AddressPolicy::check`]).
pub fn classify(ip: IpAddr) -> AddressClass {
    match ip {
        IpAddr::V4(v4) => classify_v4(v4),
        IpAddr::V6(v6) => classify_v6(v6),
    }
}

fn classify_v4(ip: Ipv4Addr) -> AddressClass {
    let [a, b, c, _] = ip.octets();
    use AddressClass::*;
    match (a, b, c) {
        (0, _, _) => AlwaysDenied("unspecified (0.0.0.0/8)"),
        (127, _, _) => AlwaysDenied("loopback (127.0.0.0/8)"),
        (169, 254, _) => AlwaysDenied("link-local (169.254.0.0/16)"),
        (224..=239, _, _) => AlwaysDenied("multicast (224.0.0.0/4)"),
        (240..=255, _, _) => AlwaysDenied("broadcast or reserved (240.0.0.0/4)"),
        (10, _, _) => Restricted("private (10.0.0.0/8)"),
        (172, 16..=31, _) => Restricted("private (172.16.0.0/12)"),
        (192, 168, _) => Restricted("private (192.168.0.0/16)"),
        (100, 64..=127, _) => Restricted("shared address space (100.64.0.0/10)"),
        (192, 0, 0) => Restricted("IETF protocol assignments (192.0.0.0/24)"),
        (198, 18..=19, _) => Restricted("benchmarking (198.18.0.0/15)"),
        _ => Public,
    }
}

fn classify_v6(ip: Ipv6Addr) -> AddressClass {
    use AddressClass::*;
    let segments = ip.segments();
    if ip.is_unspecified() {
        return AlwaysDenied("unspecified (::)");
    }
    if ip.is_loopback() {
        return AlwaysDenied("loopback (::1)");
    }
    if segments[0] & 0xffc0 == 0xfe80 {
        return AlwaysDenied("link-local (fe80::/10)");
    }
    if segments[0] & 0xff00 == 0xff00 {
        return AlwaysDenied("multicast (ff00::/8)");
    }
    if let Some((range, embedded)) = embedded_v4(ip) {
        return match classify_v4(embedded) {
            AlwaysDenied(why) => AlwaysDenied(why),
            _ => Restricted(range),
        };
    }
    if segments[0] & 0xfe00 == 0xfc00 {
        return Restricted("unique local (fc00::/7)");
    }
    if segments[0] & 0xffc0 == 0xfec0 {
        return Restricted("site-local (fec0::/10)");
    }
    Public
}

/// The IPv4 address an IPv6 form carries, with the name of the form.
fn embedded_v4(ip: Ipv6Addr) -> Option<(&'static str, Ipv4Addr)> {
    let s = ip.segments();
    let low = Ipv4Addr::new((s[6] >> 8) as u8, s[6] as u8, (s[7] >> 8) as u8, s[7] as u8);
    match s {
        [0, 0, 0, 0, 0, 0xffff, _, _] => Some(("IPv4-mapped (::ffff:0:0/96)", low)),
        [0, 0, 0, 0, 0, 0, _, _] => Some(("IPv4-compatible (::/96)", low)),
        [0x64, 0xff9b, 0, 0, 0, 0, _, _] => Some(("NAT64 (64:ff9b::/96)", low)),
        [0x64, 0xff9b, 1, ..] => Some(("local NAT64 (64:ff9b:1::/48)", low)),
        [0x2002, hi, lo, ..] => Some((
            "6to4 (2002::/16)",
            Ipv4Addr::new((hi >> 8) as u8, hi as u8, (lo >> 8) as u8, lo as u8),
        )),
        // Teredo: the client's public address is the last 32 bits, inverted.
        [0x2001, 0, ..] => Some(("Teredo (2001::/32)", Ipv4Addr::from(!u32::from(low)))),
        _ => None,
    }
}

/// A range a grant names: a host rule that is an IP literal or a CIDR (`10.0.0.0/8`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct GrantedRange {
    network: IpAddr,
    prefix: u8,
}

impl GrantedRange {
    /// Reads a grant host as an address or CIDR; `None` for a name or anything malformed.
    pub fn parse(host: &str) -> Option<GrantedRange> {
        let (addr, prefix) = match host.split_once('/') {
            Some((addr, prefix)) => (addr, Some(prefix)),
            None => (host, None),
        };
        let addr = addr.trim_start_matches('[').trim_end_matches(']');
        let network: IpAddr = addr.parse().ok()?;
        let max = if network.is_ipv4() { 32 } else { 128 };
        let prefix = match prefix {
            Some(p) if !p.is_empty() && p.bytes().all(|b| b.is_ascii_digit()) && p.len() <= 3 => {
                p.parse::<u8>().ok().filter(|&p| p <= max)?
            }
            Some(_) => return None,
            None => max,
        };
        Some(GrantedRange { network, prefix })
    }

    /// Whether `ip` lies in the range (never across address families).
    pub fn contains(&self, ip: IpAddr) -> bool {
        match (self.network, ip) {
            (IpAddr::V4(net), IpAddr::V4(ip)) => same_prefix(
                u128::from(u32::from(net)),
                u128::from(u32::from(ip)),
                32,
                self.prefix,
            ),
            (IpAddr::V6(net), IpAddr::V6(ip)) => {
                same_prefix(u128::from(net), u128::from(ip), 128, self.prefix)
            }
            _ => false,
        }
    }
}

fn same_prefix(a: u128, b: u128, bits: u8, prefix: u8) -> bool {
    let shift = u32::from(bits - prefix.min(bits));
    a.checked_shr(shift).unwrap_or(0) == b.checked_shr(shift).unwrap_or(0)
}

/// Why an address may not be dialled.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AddressDenied {
    pub address: IpAddr,
    pub why: String,
}

/// The address rules for one execution: the table, the gateway's own addresses and the ranges
/// its grant names.
#[derive(Debug, Clone, Default)]
pub struct AddressPolicy {
    own: Vec<IpAddr>,
    granted: Vec<GrantedRange>,
}

impl AddressPolicy {
    pub fn new(own: Vec<IpAddr>, granted: Vec<GrantedRange>) -> AddressPolicy {
        AddressPolicy { own, granted }
    }

    /// Checks one address.
    pub fn check(&self, ip: IpAddr) -> Result<(), AddressDenied> {
        let denied = |why: String| Err(AddressDenied { address: ip, why });
        let own = "one of the gateway's own addresses".to_string();
        if self.own.iter().any(|own| same_address(*own, ip)) {
            return denied(own);
        }
        match classify(ip) {
            AddressClass::AlwaysDenied(range) => denied(format!("{range}, always denied")),
            AddressClass::Restricted(range)
                if !self.granted.iter().any(|granted| granted.contains(ip)) =>
            {
                denied(format!("{range}, not named by the grant"))
            }
            // Otherwise dialable by the table: last, ask the kernel whether it is ours now.
            _ if is_local(ip) => denied(own),
            _ => Ok(()),
        }
    }

    /// Checks every address; the first denied one decides.
    pub fn check_all(&self, ips: &[IpAddr]) -> Result<(), AddressDenied> {
        ips.iter().try_for_each(|ip| self.check(*ip))
    }
}

/// Whether the kernel holds `ip` on one of this machine's interfaces right now: binding a UDP
/// socket to it succeeds only then (EADDRNOTAVAIL otherwise). This catches addresses added
/// after the gateway started (DHCP, a new Docker network, rotating IPv6), which a list taken
/// at start-up would miss.
fn is_local(ip: IpAddr) -> bool {
    std::net::UdpSocket::bind((ip.to_canonical(), 0)).is_ok()
}

/// Equal, also across the IPv4-mapped form (`::ffff:192.0.2.1` is `192.0.2.1`).
fn same_address(a: IpAddr, b: IpAddr) -> bool {
    a.to_canonical() == b.to_canonical()
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn addresses_on_this_machines_interfaces_are_own_addresses_even_when_granted() {
        let local = crate::config::local_interface_addresses().unwrap();
        let mut checked = 0;
        for ip in local {
            if matches!(classify(ip), AddressClass::AlwaysDenied(_)) {
                continue;
            }
            // Granted by the policy and not on the start-up list: the kernel check catches it.
            let granted = vec![GrantedRange::parse(&ip.to_string()).unwrap()];
            let err = AddressPolicy::new(Vec::new(), granted)
                .check(ip)
                .unwrap_err();
            assert!(err.why.contains("own addresses"), "{ip}: {}", err.why);
            checked += 1;
        }
        assert!(
            checked > 0,
            "this machine has no non-loopback address to check"
        );
        // TEST-NET-1 is on no interface of this machine: the table decides (public).
        let policy = AddressPolicy::new(Vec::new(), Vec::new());
        assert!(policy.check("192.0.2.123".parse().unwrap()).is_ok());
    }

    fn class(s: &str) -> AddressClass {
        classify(s.parse().unwrap())
    }

    fn always(s: &str) -> bool {
        matches!(class(s), AddressClass::AlwaysDenied(_))
    }

    fn restricted(s: &str) -> bool {
        matches!(class(s), AddressClass::Restricted(_))
    }

    #[test]
    fn always_denied() {
        for ip in [
            "127.0.0.1",
            "127.255.255.255",
            "0.0.0.0",
            "0.1.2.3",
            "169.254.169.254",
            "169.254.0.1",
            "224.0.0.1",
            "239.255.255.255",
            "255.255.255.255",
            "240.0.0.1",
            "::1",
            "::",
            "fe80::1",
            "febf::1",
            "ff02::2",
            "::ffff:127.0.0.1",
            "::ffff:169.254.169.254",
            "::127.0.0.1",
            "64:ff9b::a9fe:a9fe",
            "64:ff9b::7f00:1",
            "64:ff9b:1::a9fe:a9fe",
            "2002:a9fe:a9fe::1",
            "2002:7f00:1::",
            // Teredo: the client address is stored inverted; !5601:5601 is 169.254.169.254.
            "2001:0:4136:e378:8000:63bf:5601:5601",
        ] {
            assert!(always(ip), "{ip}: {:?}", class(ip));
        }
    }

    #[test]
    fn restricted_unless_granted() {
        for ip in [
            "10.0.0.5",
            "10.255.255.255",
            "172.16.0.1",
            "172.31.255.254",
            "192.168.1.1",
            "100.64.0.1",
            "100.100.100.200",
            "100.127.255.254",
            "192.0.0.8",
            "198.18.0.1",
            "198.19.255.255",
            "fc00::1",
            "fd00:ec2::254",
            "fec0::1",
            "::ffff:10.0.0.1",
            "::ffff:8.8.8.8",
            "64:ff9b::808:808",
            "64:ff9b::a00:1",
            "2002:a00:1::1",
            "2002:808:808::1",
            "2001:0:4136:e378:8000:63bf:3fff:fdd2",
        ] {
            assert!(restricted(ip), "{ip}: {:?}", class(ip));
        }
    }

    #[test]
    fn public() {
        for ip in [
            "8.8.8.8",
            "1.1.1.1",
            "100.63.255.254",
            "100.128.0.1",
            "172.15.255.255",
            "172.32.0.1",
            "198.17.255.255",
            "198.20.0.1",
            "198.51.100.2",
            "203.0.113.7",
            "192.0.2.2",
            "223.255.255.255",
            "2001:4860:4860::8888",
            "64:ff9c::1",
            "2001:1::1",
            "2003::1",
        ] {
            assert_eq!(class(ip), AddressClass::Public, "{ip}");
        }
    }

    #[test]
    fn teredo_embeds_the_inverted_client_address() {
        // Client 127.0.0.1 inverted is 0x80ff_fffe.
        assert!(always("2001:0:1:2:3:4:80ff:fffe"));
        // Client 8.8.8.8 inverted is 0xf7f7_f7f7: still restricted as Teredo.
        assert!(restricted("2001:0:1:2:3:4:f7f7:f7f7"));
    }

    #[test]
    fn grants_open_restricted_ranges_only() {
        let ip = |s: &str| s.parse::<IpAddr>().unwrap();
        let policy = AddressPolicy::new(
            vec![ip("198.51.100.1")],
            [
                "10.0.0.0/8",
                "192.168.1.7",
                "127.0.0.0/8",
                "169.254.169.254",
                "fd00::/8",
            ]
            .into_iter()
            .filter_map(GrantedRange::parse)
            .collect(),
        );
        assert!(policy.check(ip("10.1.2.3")).is_ok());
        assert!(policy.check(ip("192.168.1.7")).is_ok());
        assert!(policy.check(ip("192.168.1.8")).is_err());
        assert!(policy.check(ip("fd00:ec2::254")).is_ok());
        assert!(policy.check(ip("172.16.0.1")).is_err());
        // A grant can never open an always-denied range.
        assert!(policy.check(ip("127.0.0.1")).is_err());
        assert!(policy.check(ip("169.254.169.254")).is_err());
        // The gateway's own addresses, in either spelling.
        let own = policy.check(ip("198.51.100.1")).unwrap_err();
        assert!(own.why.contains("gateway's own"), "{}", own.why);
        assert!(policy.check(ip("::ffff:198.51.100.1")).is_err());
        assert!(policy.check(ip("198.51.100.2")).is_ok());
        // Every address is checked.
        assert!(policy.check_all(&[ip("8.8.8.8"), ip("127.0.0.1")]).is_err());
        assert!(policy.check_all(&[ip("8.8.8.8"), ip("1.1.1.1")]).is_ok());
    }

    #[test]
    fn granted_range_parsing() {
        assert!(GrantedRange::parse("pypi.org").is_none());
        assert!(GrantedRange::parse("10.0.0.0/33").is_none());
        assert!(GrantedRange::parse("10.0.0.0/").is_none());
        assert!(GrantedRange::parse("10.0.0.0/+8").is_none());
        assert!(GrantedRange::parse("*.example.com").is_none());
        let all = GrantedRange::parse("0.0.0.0/0").unwrap();
        assert!(all.contains("8.8.8.8".parse().unwrap()));
        assert!(!all.contains("::1".parse().unwrap()));
        let v6 = GrantedRange::parse("[fd00::]/8").unwrap();
        assert!(v6.contains("fd12::1".parse().unwrap()));
    }

    proptest! {
        /// Every IPv6 form embedding an always-denied IPv4 address is always denied too.
        #[test]
        fn embedded_always_denied_stays_denied(range in 0usize..5, low: u32, form in 0usize..5) {
            // An address in one of the always-denied IPv4 ranges.
            let [_, b, c, d] = low.to_be_bytes();
            let ip = match range {
                0 => Ipv4Addr::new(0, b, c, d),
                1 => Ipv4Addr::new(127, b, c, d),
                2 => Ipv4Addr::new(169, 254, c, d),
                3 => Ipv4Addr::new(224 + b % 16, b, c, d),
                _ => Ipv4Addr::new(240 + b % 16, b, c, d),
            };
            prop_assert!(matches!(classify_v4(ip), AddressClass::AlwaysDenied(_)), "{}", ip);
            let [a, b, c, d] = ip.octets();
            let (hi, lo) = (u16::from_be_bytes([a, b]), u16::from_be_bytes([c, d]));
            let v6 = match form {
                0 => ip.to_ipv6_mapped(),
                1 => Ipv6Addr::new(0x64, 0xff9b, 0, 0, 0, 0, hi, lo),
                2 => Ipv6Addr::new(0x2002, hi, lo, 0, 0, 0, 0, 1),
                3 => Ipv6Addr::new(0x2001, 0, 1, 2, 3, 4, !hi, !lo),
                _ => Ipv6Addr::new(0x64, 0xff9b, 1, 0, 0, 0, hi, lo),
            };
            prop_assert!(matches!(classify_v6(v6), AddressClass::AlwaysDenied(_)), "{}", v6);
        }

        /// No IPv6 form that embeds an IPv4 address is public.
        #[test]
        fn embedding_forms_are_never_public(v4: u32, rest: u64) {
            let [a, b, c, d] = v4.to_be_bytes();
            let (hi, lo) = (u16::from_be_bytes([a, b]), u16::from_be_bytes([c, d]));
            let r = rest.to_be_bytes();
            let (r0, r1) = (u16::from_be_bytes([r[0], r[1]]), u16::from_be_bytes([r[2], r[3]]));
            for v6 in [
                Ipv4Addr::from(v4).to_ipv6_mapped(),
                Ipv6Addr::new(0x64, 0xff9b, 0, 0, 0, 0, hi, lo),
                Ipv6Addr::new(0x2002, hi, lo, r0, r1, 0, 0, 1),
                Ipv6Addr::new(0x2001, 0, r0, r1, 0, 0, hi, lo),
            ] {
                prop_assert_ne!(classify_v6(v6), AddressClass::Public, "{}", v6);
            }
        }
    }
}

# sandgate suggestions: the change of data/tenants.yaml that would have allowed a request this
# bundle denied or held for review. `POST /v1/policy/proposals {"from_execution": ...}` and an
# agent's `access-request` open a proposal from it; a reviewer still decides (README.md,
# "Proposals").
#
# Input: {"input": <the decision's policy input>, "reasons": [{code, message}, ...]}.
# Output: `suggest`, a JSON merge patch (RFC 7386) per data file, e.g.
#   {"data/tenants.yaml": {"tenants": {"acme": {"languages": ["python", "bash", "ruby"]}}}}
# Undefined when this bundle has nothing to suggest for those reasons (a tenant that is not
# configured, an invalid destination, a backend or dataset the gateway does not offer): the API
# then answers `no_suggestion`.
#
# Reasons with a suggestion (each adds exactly what the request asked for, nothing broader):
#   language.not_allowed     the language, to the tenant's `languages`
#   mount.not_allowed        the datasets asked for, to the tenant's `datasets`
#   network.not_allowed      each destination not covered, as an exact `{host, ports}` entry of
#   network.review_required  `network.allow` (a tenant without `network` gets the smallest
#                            budget: 4 connections, 10 MiB, unlisted hosts denied)
#   a limit above the tenant's (the request was granted less): the tenant's limit raised to it

package sandgate

suggest := {"data/tenants.yaml": {"tenants": {input.input.principal.tenant: object.union_n(tenant_changes)}}} if {
	tenant_changes != []
}

# One patch of the tenant's entry per reason it has a suggestion for (order does not matter:
# each names other fields).
tenant_changes := [change | some change in suggestions]

suggestions contains {"languages": array.concat(languages, [input.input.request.language])} if {
	"language.not_allowed" in suggest_codes
	not input.input.request.language in languages
}

languages := object.get(suggest_tenant, "languages", [])

suggestions contains {"datasets": array.concat(object.get(suggest_tenant, "datasets", []), sort(missing_datasets))} if {
	"mount.not_allowed" in suggest_codes
	missing_datasets != set()
}

suggestions contains {"network": object.union(network_defaults, {"allow": array.concat(current_rules, new_rules)})} if {
	network_codes & suggest_codes != set()
	new_rules != []
}

suggestions contains {"limits": raised} if {
	raised != {}
}

network_codes := {"network.not_allowed", "network.review_required"}

suggest_codes := {reason.code | some reason in input.reasons}

# Undefined for a tenant the data does not name: nothing to suggest.
suggest_tenant := data.tenants[input.input.principal.tenant]

missing_datasets contains name if {
	some mount in input.input.request.mounts
	startswith(mount, "dataset:")
	name := trim_prefix(mount, "dataset:")
	not name in object.get(suggest_tenant, "datasets", [])
}

current_rules := object.get(object.get(suggest_tenant, "network", {}), "allow", [])

# A tenant that had no network gets the smallest budget; one that had keeps its own.
network_defaults := {} if {
	suggest_tenant.network
} else := {"review_unlisted_hosts": false, "max_connections": 4, "max_bytes": 10485760}

# One exact entry per requested host that the allowlist does not cover, with the ports asked.
new_rules := [{"host": host, "ports": sort({d.port | some d in input.input.request.network; d.host == host})} |
	some host in {d.host | some d in uncovered}
]

uncovered contains d if {
	some d in input.input.request.network
	not suggest_covered(d)
}

suggest_covered(d) if {
	some rule in current_rules
	d.port in rule.ports
	data.sandgate.execution.host_matches(rule.host, d.host)
}

# Each limit the request asked above the tenant's own (it ran with the tenant's).
raised := {name: value |
	some name, value in input.input.request.limits
	value > object.get(object.get(suggest_tenant, "limits", {}), name, value)
}

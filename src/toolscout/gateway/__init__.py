"""The gateway: one MCP endpoint in front of many MCP servers and HTTP APIs (`toolscout gateway CONFIG`).

The agent sees `search_tools` and `call_tool` instead of every server's tools; the gateway ranks with the
default pipeline, forwards each call to the upstream that runs the tool (with its progress, cancellation and
elicitation), passes the upstreams' prompts and resources through, and learns from the calls it forwards.
docs/gateway.md describes it for users; `core.py` holds its policies.

    config.py            the mcpServers JSON (and OpenAPI entries) → UpstreamSpec
    upstream.py          the contract every upstream honours, its status and backoff
    mcp_upstream.py      an MCP server over stdio or streamable HTTP (official SDK client): supervision,
                         pings, calls, prompts and resources
    mcp_connection.py    one connection below the SDK client: its transport screened, the server's stderr log
    openapi_upstream.py  an HTTP API described by OpenAPI: each operation a tool
    definitions.py       tool definition fingerprints, changes and approvals (--pin): in the index directory,
                         or shared by replicas in PostgreSQL
    listings.py          which indexed tools a listing lets go: the gateway's own index, or one replicas share
    attribution.py       which search a forwarded call answers (learning from calls)
    core.py              Gateway: index the listings, search, resolve and forward calls, prompts and
                         resources, learn, shut down
    mcp_server.py        what an agent sees over MCP
    stdio.py             the gateway's own stdio pipes and the fast lane for call_tool
    http.py              what the HTTP API adds (POST /tools/{id}/call, /health upstreams)
    hosts.py             several hosts on one machine: the index's lock, and its owner serving the hosts
                         of other gateways over a unix socket
    bridge.py            a gateway attached to the owner: its host relayed, the index taken over when the
                         owner stops
    runtime.py           assembling a gateway and running it over stdio or HTTP (owning its index, or
                         attached to the gateway that does)
"""

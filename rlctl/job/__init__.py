"""The job schema: TOML job files validated once into typed models (spec), their section base, the rendered
reference and `rlctl init`'s job file. Light (pydantic, no torch). Anything may import it; it imports only the
algorithm and data-path registries (for their sections) and the port layout."""

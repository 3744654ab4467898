"""The LLM agent: it turns an idea into candidate files through any OpenAI-compatible endpoint.

- `packs`: hardware and model context packs (shipped markdown, versions edited in the UI);
- `prompt`: the pure prompt-assembly function and its inputs;
- `context`: gathers those inputs from the database;
- `reply`: parses a model's reply into a candidate file and a rationale;
- `llm`: the openai client, streaming, retries and error classes;
- `endpoints`: the endpoints the operator declared, custom URLs, where a search's requests go;
- `netguard`: the address check and pinned connection for custom URLs;
- `step`: one step of an LLM search in the orchestrator loop (with hybrid tuning);
- `switch`, `notes`: services to switch the model/endpoint (recorded) and to feed notes to the
  agent;
- `stats`: per-model success rates and failure breakdowns for the search page.
"""

"""Framework integrations, each an optional extra with a guarded import:
`saga_sdk.integrations.langchain`, `.autogen`, `.openai_agents` (the OpenAI Agents
SDK), `.openai` (the OpenAI SDK patch)."""

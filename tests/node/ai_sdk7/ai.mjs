// The `ai` package this directory's package-lock.json pins, for tests/node/ai_sdk/scenarios.mjs.
export * from 'ai';

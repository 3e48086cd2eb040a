// dist/cjs holds CommonJS (.js) inside a "type": "module" package: this
// package.json makes Node (and TypeScript) read those files as CommonJS.
import { writeFileSync } from "node:fs";

writeFileSync(new URL("../dist/cjs/package.json", import.meta.url), '{ "type": "commonjs" }\n');

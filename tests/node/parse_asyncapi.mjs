// Parse an AsyncAPI document with the reference parser (@asyncapi/parser) and print, as
// one JSON object, its diagnostics and what it read: every channel's address, messages
// and reply messages. Exit 1 when the parser reports an error (severity 0).
//   node tests/node/parse_asyncapi.mjs DOCUMENT.json
import { readFile } from "node:fs/promises";
import { Parser } from "@asyncapi/parser";

const path = process.argv[2];
const parser = new Parser();
const { document, diagnostics } = await parser.parse(await readFile(path, "utf8"));
const errors = diagnostics.filter((d) => d.severity === 0);
const report = {
  errors: errors.map((d) => ({ message: d.message, path: d.path.join("/") })),
  warnings: diagnostics.filter((d) => d.severity === 1).map((d) => d.message),
  channels: {},
  operations: {},
  messages: [],
};
if (document) {
  for (const channel of document.channels().all()) {
    report.channels[channel.id()] = {
      address: channel.address(),
      messages: channel.messages().all().map((m) => m.name()),
      parameters: channel.parameters().all().map((p) => p.id()),
    };
  }
  for (const operation of document.operations().all()) {
    const reply = operation.reply();
    report.operations[operation.id()] = {
      action: operation.action(),
      channels: operation.channels().all().map((c) => c.id()),
      replies: reply ? reply.messages().all().map((m) => m.name()) : [],
    };
  }
  report.messages = document.components().messages().all().map((m) => m.name());
}
console.log(JSON.stringify(report));
process.exit(errors.length ? 1 : 0);

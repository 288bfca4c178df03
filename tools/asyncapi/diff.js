#!/usr/bin/env node
// Compares two AsyncAPI documents as CI does: each parsed, validated and dereferenced by
// @asyncapi/parser, then diffed by @asyncapi/diff with the payload rules below (the library
// leaves changes inside a payload unclassified: an added property is non-breaking, a removed
// one breaking). Prints the diff's JSON and exits 1 when a change is breaking.
//
//   node tools/asyncapi/diff.js old.json new.json
const fs = require('fs');
const { Parser } = require('@asyncapi/parser');
const { diff } = require('@asyncapi/diff');

async function load(path) {
  const { document, diagnostics } = await new Parser().parse(fs.readFileSync(path, 'utf8'));
  if (!document) {
    console.error(`${path} is not a valid AsyncAPI document:`);
    for (const d of diagnostics) console.error(`  ${d.path.join('/')}: ${d.message}`);
    process.exit(2);
  }
  return document.json();
}

// A property added to a payload (at any depth) is non-breaking; removed or changed, breaking.
// A name added to `required` is breaking; removed, non-breaking.
function payloadRules() {
  const rules = {};
  const property = { add: 'non-breaking', remove: 'breaking', edit: 'breaking' };
  const required = { add: 'breaking', remove: 'non-breaking', edit: 'breaking' };
  let at = '/channels/*/messages/*/payload';
  for (let depth = 0; depth < 8; depth++) {
    rules[`${at}/properties`] = property;
    rules[`${at}/required`] = required;
    rules[`${at}/required/*`] = required;
    at = `${at}/properties/*`;
    rules[at] = property;
  }
  return rules;
}

async function main() {
  const [before, after] = process.argv.slice(2);
  if (!before || !after) {
    console.error('usage: node tools/asyncapi/diff.js old.json new.json');
    process.exit(2);
  }
  const output = diff(await load(before), await load(after), {
    override: payloadRules(),
    outputType: 'json',
  });
  const result = {
    breaking: output.breaking(),
    nonBreaking: output.nonBreaking(),
    unclassified: output.unclassified(),
  };
  console.log(JSON.stringify(result, null, 2));
  process.exit(result.breaking.length > 0 ? 1 : 0);
}

main().catch((e) => {
  console.error(e);
  process.exit(2);
});

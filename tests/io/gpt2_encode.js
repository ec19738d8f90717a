// The parity oracle for tests/io/gpt2_tokenizer_test.cpp: encodes strings with the gpt-3-encoder
// npm package's own JavaScript (OpenAI's encoder.py ported), so memfit's C++ BPE is checked
// against an independent implementation rather than against itself.
// Usage: node gpt2_encode.js PACKAGE_DIR IN.json OUT.json
//   IN.json: a JSON array of strings; OUT.json: a JSON array of id arrays, one per string.
'use strict';
const fs = require('fs');
const path = require('path');

const [packageDir, inFile, outFile] = process.argv.slice(2);
if (!packageDir || !inFile || !outFile) {
  console.error('usage: node gpt2_encode.js PACKAGE_DIR IN.json OUT.json');
  process.exit(2);
}
// The package's main (index.js) re-exports encode/decode from Encoder.js.
const { encode } = require(path.resolve(packageDir));
const strings = JSON.parse(fs.readFileSync(inFile, 'utf-8'));
fs.writeFileSync(outFile, JSON.stringify(strings.map((s) => encode(s))));

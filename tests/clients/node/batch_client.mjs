// The official openai Node SDK against this Batch API, set up as its README says with only the base
// URL and the key changed: `new OpenAI()` reads OPENAI_BASE_URL and OPENAI_API_KEY.
//
//   OPENAI_BASE_URL=http://127.0.0.1:8080/v1 OPENAI_API_KEY=sk-local \
//     node batch_client.mjs MODEL DIR
//
// DIR holds the inputs the caller wrote: stream.jsonl (uploaded with fs.createReadStream, a chunked
// request body), buffer.jsonl (toFile(Buffer, name)), upload.jsonl (the Uploads API, two parts).
// Prints one JSON summary on stdout (what each call returned, the downloaded bytes' sha256) and
// exits 1 on any error; the caller (tests/e2e/test_clients_e2e.py) asserts on the summary.
import crypto from "node:crypto";
import fs from "node:fs";
import path from "node:path";
import OpenAI, { NotFoundError, toFile } from "openai";
import { VERSION } from "openai/version";

const TERMINAL = new Set(["completed", "failed", "expired", "cancelled"]);
const WAIT_SECONDS = 240;

const sha256 = (bytes) => crypto.createHash("sha256").update(bytes).digest("hex");
const sleep = (ms) => new Promise((resolve) => setTimeout(resolve, ms));

async function download(client, fileId) {
  const response = await client.files.content(fileId);
  return Buffer.from(await response.arrayBuffer());
}

async function fileFacts(client, file) {
  const retrieved = await client.files.retrieve(file.id);
  const content = await download(client, file.id);
  return {
    id: file.id, object: file.object, purpose: file.purpose, filename: file.filename, bytes: file.bytes,
    status: file.status, retrieved_id: retrieved.id, retrieved_bytes: retrieved.bytes,
    content_sha256: sha256(content), content_length: content.length,
  };
}

async function waitFor(client, batchId) {
  const deadline = Date.now() + WAIT_SECONDS * 1000;
  for (;;) {
    const batch = await client.batches.retrieve(batchId);
    if (TERMINAL.has(batch.status)) return batch;
    if (Date.now() > deadline) throw new Error(`batch ${batchId} still ${batch.status} after ${WAIT_SECONDS}s`);
    await sleep(250);
  }
}

async function outputFacts(client, batch) {
  const custom_ids = [];
  const status_codes = [];
  if (batch.output_file_id) {
    const text = (await download(client, batch.output_file_id)).toString("utf8");
    for (const row of text.split("\n").filter((l) => l.length > 0)) {
      const line = JSON.parse(row);
      custom_ids.push(line.custom_id);
      status_codes.push(line.response?.status_code ?? null);
    }
  }
  return {
    id: batch.id, status: batch.status, endpoint: batch.endpoint, input_file_id: batch.input_file_id,
    output_file_id: batch.output_file_id ?? null, error_file_id: batch.error_file_id ?? null,
    request_counts: batch.request_counts, usage: batch.usage ?? null, custom_ids, status_codes,
  };
}

async function main() {
  const [model, dir] = process.argv.slice(2);
  if (!model || !dir) throw new Error("usage: node batch_client.mjs MODEL DIR");
  const client = new OpenAI({ maxRetries: 0, timeout: 60_000 });
  const summary = { sdk_version: VERSION, base_url: client.baseURL };

  // Files: the README's fs.createReadStream, and toFile(Buffer, name).
  const streamPath = path.join(dir, "stream.jsonl");
  const streamed = await client.files.create({ file: fs.createReadStream(streamPath), purpose: "batch" });
  summary.stream_file = await fileFacts(client, streamed);
  const buffer = fs.readFileSync(path.join(dir, "buffer.jsonl"));
  const buffered = await client.files.create({ file: await toFile(buffer, "buffer.jsonl"), purpose: "batch" });
  summary.buffer_file = await fileFacts(client, buffered);

  // Uploads: create, two parts, complete with the md5 of the whole; the file it makes is a batch's input.
  const whole = fs.readFileSync(path.join(dir, "upload.jsonl"));
  const upload = await client.uploads.create({
    bytes: whole.length, filename: "upload.jsonl", mime_type: "text/jsonl", purpose: "batch",
  });
  const half = whole.indexOf("\n", Math.floor(whole.length / 2)) + 1; // two parts, split on a line
  const partIds = [];
  for (const part of [whole.subarray(0, half), whole.subarray(half)]) {
    partIds.push((await client.uploads.parts.create(upload.id, { data: await toFile(part, "part") })).id);
  }
  const md5 = crypto.createHash("md5").update(whole).digest("hex");
  const completed = await client.uploads.complete(upload.id, { part_ids: partIds, md5 });
  summary.upload = {
    id: upload.id, created_status: upload.status, status: completed.status, part_ids: partIds,
    file: await fileFacts(client, completed.file),
  };

  // Listing with the SDK's auto-pagination (this tenant's files only).
  const listed = [];
  for await (const file of client.files.list()) listed.push(file.id);
  summary.files_listed = listed;

  // Batches: two run to completed (the streamed file, the upload's file), one is cancelled at once.
  const chat = await client.batches.create({
    input_file_id: streamed.id, endpoint: "/v1/chat/completions", completion_window: "24h",
    metadata: { client: "openai-node" },
  });
  const fromUpload = await client.batches.create({
    input_file_id: completed.file.id, endpoint: "/v1/chat/completions", completion_window: "24h",
  });
  const toCancel = await client.batches.create({
    input_file_id: buffered.id, endpoint: "/v1/chat/completions", completion_window: "24h",
  });
  const cancelled = await client.batches.cancel(toCancel.id);
  summary.cancel = {
    id: cancelled.id, created_status: toCancel.status, status: cancelled.status,
    cancelling_at: cancelled.cancelling_at ?? null,
  };
  summary.chat_batch = { ...(await outputFacts(client, await waitFor(client, chat.id))), metadata: chat.metadata };
  summary.upload_batch = await outputFacts(client, await waitFor(client, fromUpload.id));
  summary.cancel.final_status = (await waitFor(client, toCancel.id)).status;

  // Batches listed one per page: every page walked by hand, and by auto-pagination.
  let page = await client.batches.list({ limit: 1 });
  const pages = [page.data.map((b) => b.id)];
  while (page.hasNextPage()) {
    page = await page.getNextPage();
    pages.push(page.data.map((b) => b.id));
  }
  const auto = [];
  for await (const batch of client.batches.list({ limit: 1 })) auto.push(batch.id);
  summary.batch_pages = pages;
  summary.batches_listed = auto;

  // Delete: the file is gone for retrieve and content afterwards.
  const deleted = await client.files.delete(buffered.id);
  const after = {};
  for (const [what, call] of [["retrieve", () => client.files.retrieve(buffered.id)], ["content", () => download(client, buffered.id)]]) {
    try {
      await call();
      after[what] = "found";
    } catch (error) {
      after[what] = error instanceof NotFoundError ? 404 : String(error);
    }
  }
  summary.delete = { id: deleted.id, deleted: deleted.deleted, object: deleted.object, after };
  const remaining = [];
  for await (const file of client.files.list()) remaining.push(file.id);
  summary.files_after_delete = remaining;

  process.stdout.write(JSON.stringify(summary) + "\n");
}

main().catch((error) => {
  const detail = error?.status ? ` (HTTP ${error.status}: ${JSON.stringify(error.error ?? null)})` : "";
  process.stderr.write(`openai-node client failed: ${error?.stack ?? error}${detail}\n`);
  process.exit(1);
});

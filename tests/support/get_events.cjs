// js-stellar-sdk's rpc.Server.getEvents as an application calls it: for each request on stdin
// ({url, requests: [{startLedger, filters, limit}]}), every page from startLedger on (then by
// cursor) until an empty one, each event's parsed fields written back as base64 XDR and strkeys.
// Prints [[page, ...], ...] as JSON; a refusal is {"error": {"code", "message"}} in place of pages.
const { rpc } = require("@stellar/stellar-sdk");

function plain(page) {
  return {
    latestLedger: page.latestLedger,
    latestLedgerCloseTime: page.latestLedgerCloseTime,
    cursor: page.cursor,
    events: page.events.map((e) => ({
      ...e,
      contractId: e.contractId ? e.contractId.contractId() : "",
      topic: e.topic.map((t) => t.toXDR("base64")),
      value: e.value.toXDR("base64"),
    })),
  };
}

async function pages(server, request) {
  const out = [];
  let page = await server.getEvents(request);
  for (;;) {
    out.push(plain(page));
    if (page.events.length === 0) return out;
    page = await server.getEvents({ filters: request.filters, cursor: page.cursor, limit: request.limit });
  }
}

async function main() {
  let input = "";
  for await (const chunk of process.stdin) input += chunk;
  const { url, requests } = JSON.parse(input);
  const server = new rpc.Server(url, { allowHttp: true });
  const answers = [];
  for (const request of requests) {
    try {
      answers.push(await pages(server, request));
    } catch (err) {
      const e = err && err.code !== undefined ? err : { code: null, message: String(err) };
      answers.push({ error: { code: e.code, message: e.message } });
    }
  }
  process.stdout.write(JSON.stringify(answers));
}

main().catch((err) => {
  process.stderr.write(String(err && err.stack ? err.stack : err));
  process.exit(1);
});

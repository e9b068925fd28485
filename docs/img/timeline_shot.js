// How docs/img/timeline.png was made: a `chakra-hooks timeline` file shown in Chromium's
// built-in trace viewer (the DevTools Performance panel, devtools://devtools/bundled/
// trace_app.html), offline, and screenshot. Debian's Chromium has no chrome://tracing.
//   chakra-hooks convert ../shared/corpus/pytorch/v100_dlrm_8rank -o /tmp/dlrm
//   chakra-hooks timeline /tmp/dlrm -o /tmp/dlrm.json --comm 0.25x
//   keep pids 1 and 1000001 (rank 1 and its what-if) in /tmp/dlrm_rank1.json
//   npm install puppeteer-core   (PUPPETEER_SKIP_DOWNLOAD=1: it uses /usr/bin/chromium)
//   node timeline_shot.js /tmp/dlrm_rank1.json timeline.png 2.5 11.5
// The clicks are pixel positions for this trace at 1600x1000.
const http = require('http'), fs = require('fs'), path = require('path');
const puppeteer = require('puppeteer-core');
const sleep = ms => new Promise(r => setTimeout(r, ms));
const [,, trace, out = 'timeline.png', t0, t1] = process.argv;

(async () => {
  // tiny localhost server with CORS, since trace_app fetches ?traceURL= with fetch()
  const srv = http.createServer((req, res) => {
    res.writeHead(200, {'Content-Type': 'application/json', 'Access-Control-Allow-Origin': '*'});
    fs.createReadStream(trace).pipe(res);
  });
  await new Promise(r => srv.listen(0, '127.0.0.1', r));
  const url = `http://127.0.0.1:${srv.address().port}/${path.basename(trace)}`;

  const browser = await puppeteer.launch({executablePath: '/usr/bin/chromium', headless: true,
    args: ['--no-sandbox', '--window-size=1600,1000'], defaultViewport: {width: 1600, height: 1000}});
  const page = await browser.newPage();
  await page.setBypassCSP(true);   // DevTools' CSP connect-src does not allow http://127.0.0.1
  await page.goto('devtools://devtools/bundled/trace_app.html?traceURL=' + encodeURIComponent(url),
                  {waitUntil: 'load'});
  await sleep(8000);                                    // parse + first render
  await page.mouse.click(1571, 77); await sleep(500);   // close "Keyboard shortcuts" popover
  await page.mouse.click(16, 39);   await sleep(1000);  // hide the Insights/Annotations sidebar
  await page.mouse.click(40, 150);  await sleep(700);   // expand group "rank 1 what-if ..."
  await page.mouse.click(40, 129);  await sleep(700);   // expand group "rank 1"
  if (t0 && t1) {
    // expand the thread tracks busy in the window (critical path, thread 59812, its gaps,
    // stream 7, stream 84, stream 84 peer wait) of both groups, bottom-up so upper
    // rows do not move
    const ys = [];
    for (const i of [0, 1, 2, 3, 7, 8]) ys.push(127 + i * 18.2);   // rank 1 tracks (1389-px coords)
    for (const i of [0, 1, 2, 3, 7, 8]) ys.push(378 + i * 18.2);   // what-if tracks
    for (const y of ys.reverse()) { await page.mouse.click(60, Math.round(y * 1.152)); await sleep(300); }
  }
  // give the flame chart more height: drag the splitter above "Summary" down
  await page.mouse.move(800, 801); await page.mouse.down();
  await page.mouse.move(800, 960, {steps: 10}); await page.mouse.up(); await sleep(700);
  if (t0 && t1) {   // zoom: drag a window in the overview strip (~81 px per ms for this 19.7 ms trace)
    const pxPerMs = 81.0;
    await page.mouse.move(t0 * pxPerMs, 78); await page.mouse.down();
    await page.mouse.move(t1 * pxPerMs, 78, {steps: 15}); await page.mouse.up(); await sleep(1500);
  }
  await page.mouse.move(1599, 999);
  await page.screenshot({path: out});
  await browser.close(); srv.close();
})().catch(e => { console.error(e); process.exit(1); });
